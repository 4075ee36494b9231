"""Admission: what a request must satisfy before any handler sees it (pure: ASGI callables, no framework).

Three rules, all checked by ``producers.http.app.Interceptor.dispatch`` once, before any handler runs,
so that a refused request records nothing and forwards nothing:

* **Rollout token** (``rollout_refusal``): with a rollout secret set, a request under
  ``/ng-rollout/<id>/`` must present ``schemas.rollout_tokens.rollout_token(secret, id)`` as its
  API key, ``Authorization: Bearer <token>``, ``x-api-key: <token>`` or ``x-goog-api-key: <token>``
  (any one is enough, as every harness SDK sends one of them; Google's send the last). Without a
  secret every request is admitted (a trusted network). The token never goes further:
  ``producers.http.replies.upstream_headers`` forwards none of these headers.
* **Trace declaration** (``trace_refusal``): a request under ``/ng-rollout/<id>/`` that sends
  ``x-tokentrail-trace`` must send it once, in ``producers.capture.trace_facts.TRACE_GRAMMAR``; else a
  400 naming the header, the value and the grammar. Bare paths record nothing, so there the
  header is not read (and, as everywhere, never forwarded).
* **Body size** (``read_body``): a body over ``max_body_bytes`` is refused. A declared
  ``Content-Length`` over the limit is refused before a byte is read; any other body (chunked,
  or a Content-Length the server did not enforce) is counted as it arrives and reading stops
  at the first byte past the limit, so memory stays bounded by the limit. The body read is
  replayed to the handler (``replay``), so nothing reads the request twice.

A request refused before its body was read has the rest of it read and discarded (``drain``, within
``max_body_bytes``) before the answer goes out, so the client sees the refusal, not a TCP reset.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from producers.capture.trace_facts import TRACE_HEADER, trace_problem
from schemas.errors import ContractError
from schemas.rollout_tokens import token_matches

__all__ = ["BODY_READ", "BodyTooLarge", "ClientGone", "declared_too_large", "drain", "presented_keys", "read_body",
           "replay", "rollout_refusal", "too_large_message", "trace_refusal"]

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]  # ASGI's (starlette.types.Receive)

BODY_READ = "tokentrail.body_read"  # the ASGI scope key admission sets once a request's body was read (or refused)
_LIMIT_HOW = "setting max_body_bytes: --max-body-bytes or TOKENTRAIL_MAX_BODY_BYTES"


class BodyTooLarge(ContractError):
    """The request body is over the interceptor's limit (a 413 naming it)."""


class ClientGone(ContractError):
    """The client disconnected before its request body arrived (nothing to answer)."""


def presented_keys(headers: Mapping[str, str]) -> list[str]:
    """The API keys a request presents: its Bearer credential, its ``x-api-key`` and its ``x-goog-api-key`` (the
    Google SDKs' and the Gemini CLI's), as sent."""
    keys = []
    authorization = headers.get("authorization")
    if authorization:
        scheme, _, value = authorization.strip().partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            keys.append(value.strip())
    for name in ("x-api-key", "x-goog-api-key"):
        api_key = headers.get(name)
        if api_key:
            keys.append(api_key.strip())
    return keys


def rollout_refusal(secret: bytes | None, rollout_id: str, headers: Mapping[str, str]) -> str | None:
    """None when the request may act for ``rollout_id``; else the 401 message saying what to send."""
    if secret is None:
        return None
    keys = presented_keys(headers)
    if any(token_matches(secret, rollout_id, key) for key in keys):
        return None
    what = "a key that is not this rollout's token" if keys else "no API key"
    return (f"rollout {rollout_id!r} needs its rollout token as the API key; the request sent {what}. Send "
            "'Authorization: Bearer <token>', 'x-api-key: <token>' or 'x-goog-api-key: <token>' (the harness's API "
            "key setting, e.g. OPENAI_API_KEY, ANTHROPIC_API_KEY or GEMINI_API_KEY), where <token> is what `tokentrail token <rollout-id>` prints "
            "(schemas.rollout_tokens.rollout_token) with this interceptor's TOKENTRAIL_ROLLOUT_SECRET; "
            "nothing was recorded or forwarded")


def trace_refusal(headers: Any) -> str | None:
    """None when the request declares no trace, or one valid trace; else the 400 message.

    ``headers`` is the request's Starlette ``Headers`` (``getlist``: a header sent twice is
    refused, since which declaration holds would be a guess).
    """
    values = headers.getlist(TRACE_HEADER)
    if not values:
        return None
    if len(values) > 1:
        shown = ", ".join(repr(v[:80]) for v in values[:4])
        return (f"header {TRACE_HEADER} was sent {len(values)} times ({shown}); send it once, with one trace "
                "declaration; nothing was recorded or forwarded")
    return trace_problem(values[0])


def too_large_message(size: str, limit: int) -> str:
    return (f"request body of {size} is over the interceptor's limit of {limit} bytes ({_LIMIT_HOW}); "
            "nothing was recorded or forwarded: send a smaller request, or raise the limit")


def declared_too_large(headers: Mapping[str, str], limit: int) -> str | None:
    """The 413 message when the declared Content-Length is over ``limit``; None otherwise (or undeclared)."""
    declared = headers.get("content-length")
    try:
        length = int(declared) if declared is not None else None
    except ValueError:
        return None  # the server frames the body; it is counted as it arrives
    if length is not None and length > limit:
        return too_large_message(f"{length} bytes (Content-Length)", limit)
    return None


async def read_body(receive: Receive, limit: int) -> bytes:
    """The whole body, read as it arrives; BodyTooLarge at the first byte past ``limit``."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        kind = message.get("type")
        if kind == "http.disconnect":
            raise ClientGone("the client disconnected before its request body arrived")
        if kind != "http.request":
            continue
        chunk = message.get("body") or b""
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(too_large_message(f"more than {limit} bytes (counted as it arrived)", limit))
        if chunk:
            chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def drain(receive: Receive, limit: int) -> bool:
    """Read and discard the rest of a request body, at most ``limit`` bytes; True once it ended (or the client left).

    Why: a refusal is answered before the body is read. A server that then closes the connection with
    body bytes still unread makes the kernel answer with a TCP reset, and a client still sending its body
    (or one whose receive buffer the reset discards) sees "connection reset" instead of the 400/404 (a
    probe saw 3 of 7,770 refusals so; every one with a 1 MB body and ``Connection: close``, here).
    False: the body runs past ``limit``; the caller closes the connection instead of reading more.
    """
    seen = 0
    while True:
        message = await receive()
        if message.get("type") == "http.disconnect":
            return True
        seen += len(message.get("body") or b"")
        if not message.get("more_body", False):
            return True
        if seen > limit:
            return False


def replay(body: bytes, receive: Receive) -> Receive:
    """A receive that hands out ``body`` once, then defers to ``receive`` (so a disconnect is still seen)."""
    sent = False

    async def replayed() -> MutableMapping[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
