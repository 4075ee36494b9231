"""One captured call, whatever the dialect: non-streaming, or streamed through as it is generated.

Non-streaming: the engine's answer is captured, made durable, then translated
and returned. Streaming: chunks reach the client as the engine produces them
(translated event by event, token fields removed); the engine stream is read by
a task of its own, so a client that disconnects does not cut the capture short;
only the terminal event waits until the capture is durable. A stream that
breaks is recorded as CallIncomplete(stream_interrupted) and the client gets an
error event instead of the terminal one.

Engine errors: a 5xx or an unreachable engine records CallIncomplete
(upstream_error). A 4xx means the engine generated nothing (e.g. the context
is too long), so no tokens were lost and nothing is recorded.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, AsyncIterator

import httpx
import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from producers.core import Call, Outcome
from producers.streaming import ChatStreamAccumulator
from schemas.records import IncompleteReason

if TYPE_CHECKING:
    from producers.adapters import DialectAdapter
    from producers.app import Interceptor

log = logging.getLogger("tokentrail.interceptor")
CHAT_PATH = "/v1/chat/completions"


async def handle_generation(app: Interceptor, request: Request, rollout_id: str, api_path: str,
                            adapter: DialectAdapter) -> Response:
    started = time.perf_counter()
    try:
        body = orjson.loads(await request.body())
        if not isinstance(body, dict):
            raise ValueError("the request body must be a JSON object")
        parsed = adapter.parse(body)
    except ValueError as exc:
        return adapter.error(400, f"invalid {adapter.dialect.value.lower()} request: {exc}", "invalid_request_error")
    headers = {k.lower(): v for k, v in request.headers.items()}
    core = app.core
    call = core.begin(rollout_id, api_path, adapter.dialect, adapter.id_kind, parsed, body, headers, started)
    upstream_body = core.upstream_body(call, parsed.chat_body)
    upstream_headers = app.upstream_headers(request)
    if not parsed.stream:
        return await _complete(app, call, adapter, parsed, upstream_body, upstream_headers)
    return await _stream(app, call, adapter, parsed, upstream_body, upstream_headers)


async def _complete(app: Interceptor, call: Call, adapter: DialectAdapter, parsed: Any,
                    upstream_body: dict[str, Any], headers: dict[str, str]) -> Response:
    upstream_body["stream"] = False
    sent = time.perf_counter()
    try:
        upstream = await app.upstream.post(CHAT_PATH, content=orjson.dumps(upstream_body), headers=headers)
        engine_s = time.perf_counter() - sent
    except httpx.HTTPError as exc:
        return await _engine_failed(app, call, adapter, 502, f"model server unreachable: {exc!r}")
    if upstream.status_code >= 400:
        return await _engine_error(app, call, adapter, upstream.status_code, upstream.content)
    try:
        data = orjson.loads(upstream.content)
    except ValueError as exc:
        return await _engine_failed(app, call, adapter, 502, f"model server answered with invalid JSON: {exc}")
    outcome = await app.core.complete(call, data)
    if outcome is Outcome.NOT_DURABLE:
        return app.durability_error(adapter)
    if outcome is Outcome.PREFIX_FAILED:
        return adapter.error(502, "the engine ignored the supplied parent prefix; the call was not served",
                             "prefix_not_applied")
    response = adapter.render(data, call.response_id, parsed)
    # Server-Timing (RFC-style): the engine's share and ours, durable ack included.
    ours = time.perf_counter() - call.started - engine_s
    app.metrics.overhead_seconds.observe(ours)
    response.headers["server-timing"] = f"engine;dur={engine_s * 1000:.3f}, tokentrail;dur={ours * 1000:.3f}"
    return response


async def _stream(app: Interceptor, call: Call, adapter: DialectAdapter, parsed: Any,
                  upstream_body: dict[str, Any], headers: dict[str, str]) -> Response:
    upstream_body["stream"] = True
    if adapter.id_kind != "chat":  # the translated terminal events report usage
        upstream_body["stream_options"] = {"include_usage": True}
    request = app.upstream.build_request("POST", CHAT_PATH, content=orjson.dumps(upstream_body), headers=headers)
    try:
        upstream = await app.upstream.send(request, stream=True)
    except httpx.HTTPError as exc:
        return await _engine_failed(app, call, adapter, 502, f"model server unreachable: {exc!r}")
    if upstream.status_code >= 400:
        content = await upstream.aread()
        await upstream.aclose()
        return await _engine_error(app, call, adapter, upstream.status_code, content)
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()
    app.track(asyncio.get_running_loop().create_task(_pump(app, call, adapter, parsed, upstream, queue)))

    async def body() -> AsyncIterator[bytes]:
        while (item := await queue.get()) is not None:
            yield item

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={"cache-control": "no-cache", "x-accel-buffering": "no"})


async def _pump(app: Interceptor, call: Call, adapter: DialectAdapter, parsed: Any,
                upstream: httpx.Response, queue: asyncio.Queue[bytes | None]) -> None:
    """Read the engine's stream to its end, forward it translated, then capture."""
    acc = ChatStreamAccumulator()
    out = adapter.stream_adapter(call.response_id, parsed)
    core = app.core
    ctx = call.ctx
    try:
        try:
            async for line in upstream.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = orjson.loads(data)
                if isinstance(chunk, dict) and "error" in chunk and "choices" not in chunk:
                    raise _EngineStreamError(str(chunk["error"]))
                acc.feed(chunk)
                piece = out.feed(chunk)
                if piece:
                    queue.put_nowait(piece)
        except (httpx.HTTPError, ValueError, _EngineStreamError) as exc:
            await _interrupted(core, ctx, queue, out, f"engine stream broke after {acc.chunks} chunks: {exc!r}")
            return
        if not acc.finished:
            await _interrupted(core, ctx, queue, out, f"engine stream ended without a finish_reason after {acc.chunks} chunks")
            return
        outcome = await core.complete(call, acc.response())
        if outcome is Outcome.NOT_DURABLE:
            queue.put_nowait(out.error(503, "tokentrail could not make the capture durable; retry the call"))
            return
        if outcome is Outcome.PREFIX_FAILED:
            queue.put_nowait(out.error(502, "the engine ignored the supplied parent prefix"))
            return
        rest, terminal = out.finish()
        if rest:
            queue.put_nowait(rest)
        queue.put_nowait(terminal)
    except Exception as exc:  # never leave the client hanging, never lose the evidence silently
        log.exception("stream capture failed for call %s", ctx.model_call_id)
        await core.incomplete(ctx.rollout_id, ctx.model_call_id, IncompleteReason.CAPTURE_EXCEPTION, ctx.route,
                              None, repr(exc))
        queue.put_nowait(out.error(500, f"capture failed: {exc!r}"))
    finally:
        await upstream.aclose()
        queue.put_nowait(None)


class _EngineStreamError(Exception):
    pass


async def _interrupted(core: Any, ctx: Any, queue: asyncio.Queue, out: Any, detail: str) -> None:
    ok = await core.incomplete(ctx.rollout_id, ctx.model_call_id, IncompleteReason.STREAM_INTERRUPTED, ctx.route,
                               None, detail)
    message = "the model stream was interrupted" if ok else "the model stream was interrupted and not recorded"
    queue.put_nowait(out.error(502, message))


async def _engine_failed(app: Interceptor, call: Call, adapter: DialectAdapter, status: int, detail: str) -> Response:
    ctx = call.ctx
    if not await app.core.incomplete(ctx.rollout_id, ctx.model_call_id, IncompleteReason.UPSTREAM_ERROR, ctx.route,
                                     None, detail):
        log.error("upstream failure of call %s could not be recorded", ctx.model_call_id)
    return adapter.error(status, detail, "upstream_error")


async def _engine_error(app: Interceptor, call: Call, adapter: DialectAdapter, status: int, content: bytes) -> Response:
    ctx = call.ctx
    if status >= 500:
        await app.core.incomplete(ctx.rollout_id, ctx.model_call_id, IncompleteReason.UPSTREAM_ERROR, ctx.route,
                                  status, content[:500].decode(errors="replace"))
    return adapter.upstream_error(status, content)
