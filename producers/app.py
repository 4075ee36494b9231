"""The capture interceptor: a pure ASGI app in front of an OpenAI-compatible model server.

Routes (``producers.routing``): capture under ``/ng-rollout/<id>/training-token-capture/``
(chat completions, Anthropic Messages, OpenAI Responses; streaming or not),
evaluation correlation under ``/ng-rollout/<id>/``, bare API paths forwarded,
control routes behind a bearer token (constant-time compare), ``/metrics``.

Guarantee (ARCHITECTURE §6.1): a successful model response under the capture
prefix (or its terminal stream event) is sent only after its CallCaptured or
CallIncomplete is durable: acknowledged by Kafka (acks=all), or fsynced to the
local spool when Kafka is down. Token fields never reach the client.

The engine gets the harness's headers, except its credential when
``upstream_api_key`` is set (that key is sent as Bearer instead); without it an
Anthropic ``x-api-key`` is also sent as ``Authorization: Bearer`` (vLLM's
``--api-key`` reads only that). A header value that is not ASCII (HTTP's latin-1
"obs-text") goes upstream as the very bytes the harness sent: it never fails a call.
With prefix supply, startup refuses an engine that cannot render chat requests or
ignores supplied prompt ids.

Paths come from the ASGI scope (``producers.routing``), never from Starlette's
re-parsed ``request.url``, which deletes tab/CR/LF. A path that cannot be forwarded
(``//...``, a control character) is a 400 naming it, in the caller's dialect.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from typing import Any

import httpx
import orjson
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from producers.adapters import ChatAdapter, DialectAdapter, openai_error
from producers.calls import handle_generation
from producers.capture import default_source
from producers.core import CaptureCore
from producers.durable import DurableWriter
from producers.engine_info import EngineCatalog, probe_prefix_supply
from producers.finish import handle_finish
from producers.http import error_response, json_response
from producers.lineage_index import LineageIndex
from producers.metrics import InterceptorMetrics
from producers.publisher import KafkaPublisher, producer_config
from producers.routing import (
    GENERATING,
    Kind,
    dialect_of_path,
    finish_rollout_id,
    is_control,
    is_non_generating,
    parse_route,
    scope_paths,
)
from producers.settings import InterceptorSettings
from producers.spool import Spool
from schemas.errors import ContractError
from schemas.records import IncompleteReason

log = logging.getLogger("tokentrail.interceptor")

# Request headers never forwarded upstream (hop-by-hop, or recomputed by httpx).
_DROP_REQUEST_HEADERS = {"host", "content-length", "connection", "transfer-encoding", "keep-alive", "upgrade",
                         "accept-encoding"}
_DROP_RESPONSE_HEADERS = {"content-length", "connection", "transfer-encoding", "keep-alive", "content-encoding"}


def default_adapters() -> dict[str, DialectAdapter]:
    adapters: dict[str, DialectAdapter] = {"chat": ChatAdapter()}
    try:
        from producers.dialect_adapters import AnthropicAdapter, ResponsesAdapter
    except ImportError:  # pragma: no cover - the translators ship with the package
        return adapters
    adapters["anthropic"] = AnthropicAdapter()
    adapters["responses"] = ResponsesAdapter()
    return adapters


class Interceptor:
    """ASGI application. Publisher, spool and upstream client are created at startup unless injected."""

    def __init__(
        self,
        settings: InterceptorSettings,
        *,
        publisher: KafkaPublisher | None = None,
        upstream: httpx.AsyncClient | None = None,
        adapters: dict[str, DialectAdapter] | None = None,
    ) -> None:
        self.settings = settings
        self.source = settings.source or default_source()
        self.metrics = InterceptorMetrics()
        self.adapters = adapters or default_adapters()
        self._publisher = publisher
        self._upstream = upstream
        self._tasks: set[asyncio.Task] = set()
        self.core: CaptureCore | None = None  # type: ignore[assignment]

    # -- ASGI -----------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        response = await self.dispatch(Request(scope, receive))
        await response(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:  # report, so uvicorn exits with the reason
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def startup(self) -> None:
        s = self.settings
        catalog = EngineCatalog()
        if s.prefix_supply:
            injected = self._upstream is not None
            try:
                await self._probe_prefix_supply(catalog)
            except BaseException:
                if not injected and self._upstream is not None:
                    await self._upstream.aclose()
                    self._upstream = None
                raise
        if self._publisher is None:
            self._publisher = KafkaPublisher(
                producer_config(s.bootstrap, linger_ms=s.linger_ms, delivery_timeout_ms=s.publish_timeout_ms)
            )
        if self._upstream is None:
            self._upstream = self._client()
        spool = Spool(s.spool_dir) if s.spool_dir is not None else None
        writer = DurableWriter(self._publisher, spool, bootstrap=s.bootstrap,
                               on_depth=self.metrics.spool_depth.set)
        index = LineageIndex(max_rollouts=s.index_max_rollouts, max_tokens=s.index_max_tokens,
                             keep_tokens=s.prefix_supply)
        self.core = CaptureCore(s, writer, index, self.metrics, self.source)
        self.core.catalog = catalog
        self.metrics.spool_depth.set(writer.spooled)
        writer.start()

    async def _probe_prefix_supply(self, catalog: EngineCatalog) -> None:
        """ConfigError (startup fails) unless the engine can take supplied prompt ids."""
        s = self.settings
        if self._upstream is None:
            self._upstream = self._client()
        auth = {"authorization": f"Bearer {s.upstream_api_key.get_secret_value()}"} if s.upstream_api_key else {}
        info = await catalog.get(self._upstream, auth)
        await probe_prefix_supply(self._upstream, auth, s.upstream_model or (info.names[0] if info else None))

    def _client(self) -> httpx.AsyncClient:
        s = self.settings
        return httpx.AsyncClient(
            base_url=s.upstream_url,
            timeout=httpx.Timeout(s.upstream_timeout_s, connect=10.0),
            limits=httpx.Limits(max_connections=1024, max_keepalive_connections=256),
        )

    async def shutdown(self) -> None:
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=30)
        if self.core is not None:
            await self.core.writer.close()
        if self._upstream is not None:
            await self._upstream.aclose()
        if self._publisher is not None:
            left = await self._publisher.close()
            if left:
                log.error("%d events were not flushed to Kafka at shutdown", left)

    @property
    def upstream(self) -> httpx.AsyncClient:
        assert self._upstream is not None, "Interceptor.startup() has not run"
        return self._upstream

    def track(self, task: asyncio.Task) -> None:
        """Keep a background task (a stream pump) alive until it ends."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- dispatch -------------------------------------------------------------
    async def dispatch(self, request: Request) -> Response:
        # The scope's path, not request.url.path: Starlette rebuilds the URL through urlsplit, which deletes
        # tab/CR/LF and would rewrite a rollout id (producers.routing).
        path, raw_path = scope_paths(request.scope)
        if path == "/metrics":
            return Response(self.metrics.render(), media_type=self.metrics.content_type)
        if path == "/healthz":
            return json_response({"status": "ok", "spooled": self.core.writer.spooled if self.core else 0})
        if is_control(path):
            return await self._control(request, path, raw_path)
        try:
            route = parse_route(path, raw_path)
        except ContractError as exc:
            return self.error_for(path, 400, str(exc), "invalid_rollout_id")
        if route.kind is not Kind.CAPTURE:
            return await self.forward(request, route.api_path)
        assert route.rollout_id is not None
        dialect = GENERATING.get(route.api_path.rstrip("/"))
        if dialect is not None and request.method == "POST":
            adapter = self.adapters.get(dialect)
            if adapter is None:
                return await self._uncapturable(request, route.rollout_id, route.api_path, f"the {dialect} dialect")
            return await handle_generation(self, request, route.rollout_id, route.api_path, adapter)
        if is_non_generating(route.api_path):
            return await self.forward(request, route.api_path)
        return await self._forward_unknown(request, route.rollout_id, route.api_path)

    async def _control(self, request: Request, path: str, raw_path: bytes | None) -> Response:
        if not self._authorized(request):
            return error_response(401, "control routes need 'Authorization: Bearer <token>' matching "
                                       "TOKENTRAIL_CONTROL_TOKEN", "unauthorized")
        try:
            rollout_id = finish_rollout_id(path, raw_path)
        except ContractError as exc:
            return error_response(400, str(exc), "invalid_rollout_id")
        if rollout_id is not None and request.method == "POST":
            return await handle_finish(self, request, rollout_id)
        if path == "/tokentrail/admin/policy-version" and request.method == "POST":
            try:
                version = orjson.loads(await request.body())["version"]
            except (ValueError, KeyError, TypeError):
                return error_response(400, 'body must be {"version": "<policy version>"}', "invalid_request_error")
            self.core.admin_policy_version = None if version is None else str(version)
            return json_response({"policy_version": self.core.admin_policy_version})
        return error_response(404, f"no control route {request.method} {path!r}", "not_found")

    def _authorized(self, request: Request) -> bool:
        token = self.settings.control_token
        if token is None:
            return False
        given = request.headers.get("authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {token.get_secret_value()}".encode())

    # -- forwarding -----------------------------------------------------------
    def upstream_headers(self, request: Request) -> dict[str, str | bytes]:
        """The harness's headers for the engine. A value that is not ASCII (HTTP allows latin-1 "obs-text",
        httpx encodes str values as ASCII and would fail the call) goes as the very bytes the harness sent."""
        headers = {k.lower(): v for k, v in request.headers.items() if k.lower() not in _DROP_REQUEST_HEADERS}
        key = self.settings.upstream_api_key
        if key is not None:
            # The harness's credential is not the engine's: it is not forwarded at all.
            headers.pop("x-api-key", None)
            headers["authorization"] = f"Bearer {key.get_secret_value()}"
        elif "x-api-key" in headers and "authorization" not in headers:
            headers["authorization"] = f"Bearer {headers['x-api-key']}"
        return {k: v if v.isascii() else v.encode("latin-1", errors="replace") for k, v in headers.items()}

    def error_for(self, path: str, status: int, message: str, kind: str) -> Response:
        """An error in the dialect of the API route ``path`` names (OpenAI's shape when it names none)."""
        dialect = dialect_of_path(path)
        adapter = self.adapters.get(dialect) if dialect else None
        return adapter.error(status, message, kind) if adapter is not None else error_response(status, message, kind)

    async def forward(self, request: Request, api_path: str) -> Response:
        """Stream a request to the engine and its answer back, unchanged."""
        try:
            url = httpx.URL(path=api_path, query=bytes(request.scope.get("query_string") or b""))
            upstream_request = self.upstream.build_request(
                request.method, url, headers=self.upstream_headers(request), content=request.stream()
            )
        except httpx.InvalidURL as exc:  # e.g. a path starting with "//", or with a control character
            return self.error_for(api_path, 400, f"invalid request path {api_path!r}: {exc}; send a path without "
                                                 "empty segments ('//') or control characters", "invalid_request_error")
        try:
            upstream = await self.upstream.send(upstream_request, stream=True)
        except Exception as exc:  # an in-process upstream raises anything, not only httpx errors
            return error_response(502, f"model server unreachable: {exc!r}", "upstream_error")
        headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _DROP_RESPONSE_HEADERS}
        # An in-process transport may hand back an already-read body.
        chunks = iter([upstream.content]) if upstream.is_stream_consumed else upstream.aiter_raw()
        return StreamingResponse(chunks, status_code=upstream.status_code, headers=headers,
                                 background=BackgroundTask(upstream.aclose))

    async def _uncapturable(self, request: Request, rollout_id: str, api_path: str, what: str) -> Response:
        """A generating call this build cannot capture: forward it and mark the rollout incomplete (fail closed)."""
        if not await self.core.incomplete(rollout_id, None, "capture_unsupported", api_path, None,
                                          f"{what} is not captured by this interceptor"):
            return self.durability_error()
        return await self.forward(request, api_path)

    async def _forward_unknown(self, request: Request, rollout_id: str, api_path: str) -> Response:
        response = await self.forward(request, api_path)
        if 200 <= response.status_code < 300:
            # An unknown route that succeeded may have generated tokens we did not see.
            if not await self.core.incomplete(rollout_id, None, IncompleteReason.UNKNOWN_ROUTE, api_path,
                                              response.status_code,
                                              f"{request.method} {api_path} answered under the capture prefix"):
                if response.background is not None:
                    await response.background()
                return self.durability_error()
        return response

    def durability_error(self, adapter: DialectAdapter | None = None) -> Response:
        message = ("tokentrail could not make the capture durable (Kafka unavailable and no spool); the call was "
                   "not acknowledged so it cannot be trained on: retry it")
        if adapter is not None:
            return adapter.error(503, message, "capture_unavailable")
        return openai_error(503, message, "capture_unavailable")

    async def publish_event(self, event: Any) -> None:
        await self.core.write_event(event)
