"""Stateless HTTP helpers of the interceptor: JSON and error responses, the engine's headers, forwarding.

Guarantees: error bodies have the shape OpenAI-compatible clients expect
(``{"error": {"message", "type", "code"}}``). Headers towards the engine come from an
allow-list (``FORWARDED_REQUEST_HEADERS``), never the harness's credentials, cookies or
forwarding headers: the engine's only credential is ``upstream_api_key``. An allowed header
value that is not ASCII (HTTP's latin-1 "obs-text") goes upstream as the very bytes the
harness sent, so it never fails a call. A forwarded answer streams back unchanged (status,
body, headers but the hop-by-hop ones), except a redirect: an engine 3xx is a 502 naming
it, without its ``Location`` (which would give the harness the engine's address). Nothing
here holds state: every input is an argument.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx
import orjson
from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse

if TYPE_CHECKING:
    from pydantic import SecretStr
    from starlette.datastructures import Headers
    from starlette.requests import Request

__all__ = ["DURABILITY_MESSAGE", "FORWARDED_REQUEST_HEADERS", "ErrorShape", "durability_error", "error_response",
           "engine_path", "event_json", "forward", "json_response", "path_problem", "upstream_headers"]

# The only harness headers the engine gets. What vLLM reads of a request: content-type, x-request-id (its
# request id with --enable-request-id-headers), traceparent/tracestate (OpenTelemetry); accept and the
# Anthropic API-version headers describe the API shape asked for; user-agent is harmless and logged.
# Never: authorization, x-api-key, x-goog-api-key (a harness's real key, or its rollout token), cookie,
# proxy-authorization, x-forwarded-*/forwarded/x-real-ip (client addresses), hop-by-hop headers, or
# anything unknown. The engine's credential is upstream_api_key alone.
FORWARDED_REQUEST_HEADERS = frozenset({"content-type", "accept", "user-agent", "x-request-id", "traceparent",
                                       "tracestate", "anthropic-version", "anthropic-beta"})
# Hop-by-hop and framing headers, and the engine's date/server: the ASGI server (uvicorn) adds its own two, so
# passing the engine's on would send each twice (issue 26).
_DROP_RESPONSE_HEADERS = frozenset({"content-length", "connection", "transfer-encoding", "keep-alive",
                                    "content-encoding", "date", "server"})
# What a path segment may hold unencoded towards the engine (RFC 3986 pchar minus '%'): every '%' of the checked,
# decoded path is sent as %25, so the engine decodes exactly that path and nothing on the way re-resolves it.
_PATH_SAFE = "/:@!$&'()*+,;=-._~"
_BODYLESS = frozenset({"GET", "HEAD"})

DURABILITY_MESSAGE = ("tokentrail could not make the capture durable (Kafka unavailable and no spool); the call was "
                      "not acknowledged so it cannot be trained on: retry it")

# (status, message, error type) -> an error response in some dialect's shape.
ErrorShape = Callable[[int, str, str], Response]


def event_json(data: Any) -> bytes:
    """An SSE event's data as ``producers.dialects.common.compact_json`` makes it, by orjson (~10x faster;
    the same JSON value, and the same bytes for what translators emit). ValueError, as the stdlib's
    encoder raises, for what JSON cannot hold."""
    try:
        return orjson.dumps(data)
    except TypeError as exc:  # orjson.JSONEncodeError: the relay records a ValueError as untranslatable
        raise ValueError(f"a stream event cannot be encoded as JSON: {exc}") from exc


def json_response(payload: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(payload), status_code=status, media_type="application/json")


def error_response(status: int, message: str, kind: str) -> Response:
    return json_response({"error": {"message": message, "type": kind, "code": status}}, status)


def durability_error(shape: ErrorShape = error_response) -> Response:
    """The 503 of a call whose evidence could not be made durable (it must not be acknowledged)."""
    return shape(503, DURABILITY_MESSAGE, "capture_unavailable")


def upstream_headers(headers: Headers, api_key: SecretStr | None) -> dict[str, str | bytes]:
    """The harness's headers for the engine: ``FORWARDED_REQUEST_HEADERS`` only, plus the engine's key.

    ``api_key`` (``upstream_api_key``, vLLM's ``--api-key``) goes as ``Authorization: Bearer``;
    whatever credential the harness sent is never forwarded. A value that is not ASCII (httpx
    encodes str values as ASCII and would fail the call) goes as the very bytes the harness sent.
    """
    out: dict[str, str] = {k.lower(): v for k, v in headers.items() if k.lower() in FORWARDED_REQUEST_HEADERS}
    if api_key is not None:
        out["authorization"] = f"Bearer {api_key.get_secret_value()}"
    return {k: v if v.isascii() else v.encode("latin-1", errors="replace") for k, v in out.items()}


def path_problem(api_path: str) -> str | None:
    """Why ``api_path`` cannot be sent to the engine (an empty segment ``//``, a control character), or None."""
    try:
        httpx.URL(path=api_path)
    except httpx.InvalidURL as exc:
        return (f"invalid request path {api_path!r}: {exc}; send a path without empty segments ('//') or control "
                "characters")
    if "//" in api_path:
        return (f"invalid request path {api_path!r}: it has an empty segment ('//'), which an engine may read as "
                "another route; send the path without doubled slashes")
    return None


def engine_path(api_path: str) -> str:
    """The engine URL's path for the checked, decoded ``api_path``: percent-encoded once, '%' included.

    The HTTP clients on the way (httpx, yarl under aiohttp) decode escapes of unreserved characters and resolve
    dot segments; with every '%' encoded, ``%2e`` in a decoded path stays the three characters it is.
    """
    return quote(api_path, safe=_PATH_SAFE) if not api_path.isascii() or "%" in api_path or "\\" in api_path \
        else api_path


async def forward(client: httpx.AsyncClient, request: Request, api_path: str, headers: dict[str, str | bytes],
                  shape: ErrorShape = error_response) -> Response:
    """Stream ``request`` to the engine at ``api_path`` and its answer back, unchanged.

    A path httpx cannot send is a 400 naming it, in ``shape``; an engine that cannot be
    reached, or that answers with a redirect, is a 502.
    """
    try:
        url = httpx.URL(path=engine_path(api_path), query=bytes(request.scope.get("query_string") or b""))
        # A GET or HEAD carries no body to the engine, whatever the harness sent (issue 26).
        content = None if request.method.upper() in _BODYLESS else request.stream()
        # httpx takes str and bytes header values mixed (each is normalized); its type hint says one or the other.
        upstream_request = client.build_request(request.method, url, headers=headers,  # type: ignore[arg-type]
                                                content=content)
    except httpx.InvalidURL as exc:  # e.g. a path starting with "//", or with a control character
        return shape(400, path_problem(api_path) or f"invalid request path {api_path!r}: {exc}",
                     "invalid_request_error")
    try:
        upstream = await client.send(upstream_request, stream=True)
    except Exception as exc:  # an in-process upstream raises anything, not only httpx errors
        return error_response(502, f"model server unreachable: {exc!r}", "upstream_error")
    if 300 <= upstream.status_code < 400:
        # Never hand an engine redirect on: its Location names the engine's own address.
        status = upstream.status_code
        await upstream.aclose()
        return shape(502, f"the model server answered {request.method} {api_path} with a redirect (HTTP {status}); "
                          "tokentrail does not pass redirects on: call the route's exact path (e.g. without a "
                          "trailing '/')", "upstream_error")
    kept = {k: v for k, v in upstream.headers.items() if k.lower() not in _DROP_RESPONSE_HEADERS}
    # An in-process transport may hand back an already-read body.
    chunks = iter([upstream.content]) if upstream.is_stream_consumed else upstream.aiter_raw()
    return StreamingResponse(chunks, status_code=upstream.status_code, headers=kept,
                             background=BackgroundTask(upstream.aclose))
