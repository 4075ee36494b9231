"""``handle_generation``: the HTTP side of one captured call (``CaptureServices`` and a dialect adapter only).

Before dispatch the request is fitted to the engine (``CaptureCore.begin``: a model it serves, a budget within
``max_model_len``) and, with prefix supply, given its exact prompt ids (``producers.prefix_supply``).

Non-streaming: the engine's answer is judged, translated, made durable, then returned. Streaming: chunks reach
the client as the engine produces them (translated event by event, token fields removed); the engine stream is
read by a task of its own, so a client that disconnects does not cut the capture short; only the terminal
event waits until the capture is durable. Either way a call leaves exactly one record (``producers.capture``).

A request that cannot be read (not JSON, not an object, nested deeper than
``producers.json_limits.MAX_JSON_DEPTH``) or that the dialect refuses is a 400 in the caller's dialect naming
the field; nothing is recorded and nothing reaches the engine.

Engine errors, each recorded with the engine's message: no answer at all (whatever the transport raised; an
in-process upstream raises anything, e.g. KeyError) or a 5xx is CallIncomplete(upstream_error); a 4xx is
CallIncomplete(engine_rejected), after one retry with a smaller max_tokens when the engine refused it for its
context window and the window still has room. A broken stream is CallIncomplete(stream_interrupted), an error
event mid-stream CallIncomplete(upstream_error); the client then gets an error event instead of the terminal
one. An aborted generation (vLLM pauses in-flight requests for a weight sync) is CallIncomplete(aborted) and a
503 the harness can retry. Anything else that goes wrong is CallIncomplete(capture_exception), a 500 naming it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, AsyncIterator

import orjson
from starlette.responses import Response, StreamingResponse

from producers import prefix_supply
from producers.capture import Call, Outcome
from producers.engine_info import (
    CHAT_PATH,
    EngineCallError,
    context_refusal,
    engine_message,
    max_tokens_key,
    prompt_tokens,
    render_ids,
)
from producers.dialects.common import json_type
from producers.http import durability_error
from producers.json_limits import load_json, nesting_problem
from producers.streaming import ChatStreamAccumulator
from schemas.records import IncompleteReason

if TYPE_CHECKING:
    from starlette.requests import Request

    from producers.dialects.base import DialectAdapter, StreamAdapter
    from producers.services import CaptureServices

__all__ = ["handle_generation"]

log = logging.getLogger("tokentrail.interceptor")
_SERVED = (Outcome.CAPTURED, Outcome.INCOMPLETE)
# How each refused outcome reaches the harness: status, error type, message.
_REFUSED = {
    Outcome.ABORTED: (503, "engine_aborted", "the engine aborted the generation (it pauses in-flight requests for "
                                             "a weight update); retry the call"),
    Outcome.ENGINE_FAILED: (502, "upstream_error", "the engine failed the generation; retry the call"),
    Outcome.UNTRANSLATABLE: (502, "upstream_error", "the model's answer cannot be expressed in this API"),
    Outcome.PREFIX_FAILED: (502, "prefix_not_applied", "the engine ignored the supplied prompt ids; the call was "
                                                       "not served"),
    Outcome.NOT_DURABLE: (503, "capture_unavailable", "tokentrail could not make the capture durable; retry the call"),
}
_ENGINE_ENDED = ("abort", "error")  # finish reasons the core records as failures


async def handle_generation(svc: CaptureServices, request: Request, rollout_id: str, api_path: str,
                            adapter: DialectAdapter) -> Response:
    started = time.perf_counter()
    what = f"invalid {adapter.spec.wire.value.lower()} request"
    try:
        body = load_json(await request.body(), "the request body")
        if not isinstance(body, dict):
            raise ValueError(f"the request body must be a JSON object, got a JSON {json_type(body)}")
        problem = nesting_problem(body)
        if problem is not None:
            raise ValueError(problem)
        parsed = adapter.parse(body)
    except ValueError as exc:
        return adapter.error(400, f"{what}: {exc}", "invalid_request_error")
    except Exception as exc:  # a malformed request the dialect's checks missed: a 400 naming it, never a bare 500
        log.exception("request of rollout %s could not be read", rollout_id)
        return adapter.error(400, f"{what}: it could not be read ({type(exc).__name__}: {exc}); check each field's "
                                  "type against the API reference", "invalid_request_error")
    headers = {k.lower(): v for k, v in request.headers.items()}
    upstream_headers = svc.upstream_headers(request)
    upstream_headers["content-type"] = "application/json"  # the body is ours; vLLM refuses any other type
    core = svc.core
    call: Call | None = None
    try:
        engine = await core.catalog.get(svc.upstream, _auth(upstream_headers))
        call = core.begin(rollout_id, api_path, adapter.spec, parsed, body, headers, started, engine)
        if call.prefix_requested:
            await _supply_prefix(svc, call, upstream_headers)
        upstream_body = core.upstream_body(call)
        if not parsed.stream:
            return await _complete(svc, call, adapter, parsed, upstream_body, upstream_headers)
        return await _stream(svc, call, adapter, parsed, upstream_body, upstream_headers)
    except Exception as exc:  # never an unexplained 500: record what broke, then say so
        log.exception("capture of a call of rollout %s failed", rollout_id)
        call_id = call.ctx.model_call_id if call is not None else None
        await core.incomplete(rollout_id, call_id, IncompleteReason.CAPTURE_EXCEPTION, api_path, None, repr(exc))
        return adapter.error(500, f"capture failed: {exc!r}", "capture_error")


def _auth(headers: dict[str, str]) -> dict[str, str]:
    return {"authorization": headers["authorization"]} if "authorization" in headers else {}


async def _supply_prefix(svc: CaptureServices, call: Call, headers: dict[str, str]) -> None:
    """Put the exact prompt ids on ``call`` when they can be built; otherwise it is sent as rendered."""
    why = prefix_supply.ineligible(call.body)
    if not why:
        through_parent, full = prefix_supply.render_bodies(call.body)
        parent = call.resolution.parent
        assert parent is not None and parent.cum_tokens is not None  # begin() set prefix_requested
        bodies = [through_parent, full] + ([] if parent.ends_on_stop else [prefix_supply.emptied_body(through_parent)])
        auth = _auth(headers)
        rendered = await asyncio.gather(*(render_ids(svc.upstream, auth, b) for b in bodies), return_exceptions=True)
        failed = next((r for r in rendered if isinstance(r, BaseException)), None)
        if failed is not None:
            if not isinstance(failed, EngineCallError):
                raise failed
            why = f"render failed: {failed}"
        else:
            result = prefix_supply.splice(parent.cum_tokens.tolist(), *rendered)
            call.supplied_prefix, why = result.ids, result.reason
    if why:
        log.info("prompt ids not supplied for call %s: %s", call.ctx.model_call_id, why)


async def _send(svc: CaptureServices, call: Call, adapter: DialectAdapter, body: dict[str, Any],
                headers: dict[str, str]) -> Any:
    """The engine's streaming answer (status < 400), or the error the harness gets (evidence recorded)."""
    for attempt in (1, 2):
        try:
            request = svc.upstream.build_request("POST", CHAT_PATH, content=orjson.dumps(body), headers=headers)
            upstream = await svc.upstream.send(request, stream=True)
        except Exception as exc:
            return await _engine_failed(svc, call, adapter, f"model server unreachable: {exc!r}")
        if upstream.status_code < 400:
            return upstream
        try:
            content = await upstream.aread()
        except Exception as exc:
            return await _engine_failed(svc, call, adapter, f"model server error {upstream.status_code} unreadable: "
                                                            f"{exc!r}")
        finally:
            await upstream.aclose()
        if attempt == 1 and upstream.status_code == 400:
            budget = await _context_budget(svc, call, body, headers, content)
            if budget is not None:
                svc.core.lower_max_tokens(call, body, budget)
                continue
        return await _engine_error(svc, call, adapter, upstream.status_code, content)
    raise AssertionError("unreachable: the second attempt always returns")


async def _context_budget(svc: CaptureServices, call: Call, body: dict[str, Any], headers: dict[str, str],
                          content: bytes) -> int | None:
    """A max_tokens the engine can serve after it refused ``body`` for its context window; None: none can."""
    refusal = context_refusal(engine_message(content))
    sent = body.get(max_tokens_key(body))
    if refusal is None or not isinstance(sent, int):
        return None
    info = svc.core.catalog.info
    limit = refusal.max_model_len or (info.max_model_len(body.get("model")) if info else None)
    if limit is None:
        return None
    if refusal.over_limit:
        budget = limit  # the engine then caps it at what the prompt leaves (vLLM get_max_tokens)
    else:
        used = refusal.input_tokens
        if used is None:
            try:
                used = len(call.supplied_prefix) if call.supplied_prefix else await prompt_tokens(
                    svc.upstream, _auth(headers), body)
            except EngineCallError as exc:
                log.warning("cannot measure the prompt of call %s to fit max_tokens: %s", call.ctx.model_call_id, exc)
                return None
        budget = limit - used
    return budget if 1 <= budget < sent else None


async def _complete(svc: CaptureServices, call: Call, adapter: DialectAdapter, parsed: Any,
                    upstream_body: dict[str, Any], headers: dict[str, str]) -> Response:
    upstream_body["stream"] = False
    sent = time.perf_counter()
    upstream = await _send(svc, call, adapter, upstream_body, headers)
    if isinstance(upstream, Response):
        return upstream
    try:
        content = await upstream.aread()
    except Exception as exc:
        return await _engine_failed(svc, call, adapter, f"reading the model server's answer failed: {exc!r}")
    finally:
        await upstream.aclose()
    engine_s = time.perf_counter() - sent
    try:
        data = orjson.loads(content)
        if not isinstance(data, dict):
            raise ValueError(f"a JSON {type(data).__name__}, not an object")
    except ValueError as exc:
        return await _engine_failed(svc, call, adapter, f"model server answered with invalid JSON: {exc}")
    outcome = await svc.core.complete(call, data, prepare=lambda: adapter.render(data, call.response_id, parsed))
    if outcome is Outcome.NOT_DURABLE:
        return durability_error(adapter.error)
    if outcome not in _SERVED:
        return _refused(adapter, call, outcome)
    response: Response = call.answer
    # Server-Timing (RFC-style): the engine's share and ours, durable ack included.
    ours = time.perf_counter() - call.started - engine_s
    svc.metrics.overhead_seconds.observe(ours)
    response.headers["server-timing"] = f"engine;dur={engine_s * 1000:.3f}, tokentrail;dur={ours * 1000:.3f}"
    return response


def _refused(adapter: DialectAdapter, call: Call, outcome: Outcome) -> Response:
    status, kind, message = _REFUSED[outcome]
    response = adapter.error(status, _with_failure(message, call, outcome), kind)
    if outcome is Outcome.ABORTED:
        # The OpenAI and Anthropic SDKs read these: retry, after a moment.
        response.headers["x-should-retry"] = "true"
        response.headers["retry-after"] = "1"
    return response


def _with_failure(message: str, call: Call, outcome: Outcome) -> str:
    return f"{message}: {call.failure}" if outcome is Outcome.UNTRANSLATABLE and call.failure else message


async def _stream(svc: CaptureServices, call: Call, adapter: DialectAdapter, parsed: Any,
                  upstream_body: dict[str, Any], headers: dict[str, str]) -> Response:
    upstream_body["stream"] = True
    if adapter.spec.stream_usage:  # the translated terminal events report usage
        upstream_body["stream_options"] = {"include_usage": True}
    upstream = await _send(svc, call, adapter, upstream_body, headers)
    if isinstance(upstream, Response):
        return upstream
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()
    svc.tasks.track(asyncio.get_running_loop().create_task(_pump(svc, call, adapter, parsed, upstream, queue)))

    async def body() -> AsyncIterator[bytes]:
        while (item := await queue.get()) is not None:
            yield item

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={"cache-control": "no-cache", "x-accel-buffering": "no"})


async def _pump(svc: CaptureServices, call: Call, adapter: DialectAdapter, parsed: Any,
                upstream: Any, queue: asyncio.Queue[bytes | None]) -> None:
    """Read the engine's stream to its end, forward it translated, then capture."""
    acc = ChatStreamAccumulator()
    out = adapter.stream_adapter(call.response_id, parsed)
    core = svc.core
    ctx = call.ctx
    try:
        broke = await _relay(upstream, acc, out, queue)
        if broke is None and not acc.finished:
            broke = (IncompleteReason.STREAM_INTERRUPTED,
                     f"engine stream ended without a finish_reason after {acc.chunks} chunks")
        if broke is not None:
            reason, detail = broke
            ok = await core.incomplete(ctx.rollout_id, ctx.model_call_id, reason, ctx.route, None, detail)
            message = f"the model stream failed ({reason})" + ("" if ok else " and was not recorded")
            queue.put_nowait(out.error(502, message, "upstream_error"))
            return
        outcome = await core.complete(call, acc.response(), prepare=out.finish)
        if outcome in _SERVED:
            rest, terminal = call.answer
            if rest:
                queue.put_nowait(rest)
            queue.put_nowait(terminal)
        else:
            status, kind, message = _REFUSED[outcome]
            queue.put_nowait(out.error(status, _with_failure(message, call, outcome), kind))
    except Exception as exc:  # never leave the client hanging, never lose the evidence silently
        log.exception("stream capture failed for call %s", ctx.model_call_id)
        await core.incomplete(ctx.rollout_id, ctx.model_call_id, IncompleteReason.CAPTURE_EXCEPTION, ctx.route,
                              None, repr(exc))
        queue.put_nowait(out.error(500, f"capture failed: {exc!r}"))
    finally:
        await upstream.aclose()
        queue.put_nowait(None)


async def _relay(upstream: Any, acc: ChatStreamAccumulator, out: StreamAdapter,
                 queue: asyncio.Queue[bytes | None]) -> tuple[str, str] | None:
    """Forward the engine's chunks as they come; (reason, detail) when the stream cannot be completed."""
    lines = upstream.aiter_lines()
    while True:
        try:
            line = await anext(lines)
        except StopAsyncIteration:
            return None
        except Exception as exc:  # any transport failure, httpx's or an in-process upstream's
            return IncompleteReason.STREAM_INTERRUPTED, f"engine stream broke after {acc.chunks} chunks: {exc!r}"
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return None
        try:
            chunk = orjson.loads(data)
        except ValueError as exc:
            return IncompleteReason.STREAM_INTERRUPTED, f"engine chunk {acc.chunks + 1} is not JSON: {exc}"
        if not isinstance(chunk, dict):
            return IncompleteReason.STREAM_INTERRUPTED, f"engine chunk {acc.chunks + 1} is not a JSON object"
        if "error" in chunk and "choices" not in chunk:
            return IncompleteReason.UPSTREAM_ERROR, f"engine error after {acc.chunks} chunks: {chunk['error']}"
        try:  # the one chunk reader (producers.dialects.chat_chunks) refuses what no dialect can express
            acc.feed(chunk)
        except ValueError as exc:
            return (IncompleteReason.UNTRANSLATABLE_OUTPUT,
                    f"engine chunk {acc.chunks + 1} cannot be expressed in the client's dialect: {exc}")
        if acc.finish_reason in _ENGINE_ENDED:
            return None  # the core records it; the harness gets an error event, not this chunk
        try:
            piece = out.feed(chunk)
        except ValueError as exc:
            return (IncompleteReason.UNTRANSLATABLE_OUTPUT,
                    f"engine chunk {acc.chunks} cannot be expressed in the client's dialect: {exc}")
        if piece:
            queue.put_nowait(piece)


async def _engine_failed(svc: CaptureServices, call: Call, adapter: DialectAdapter, detail: str) -> Response:
    ctx = call.ctx
    if not await svc.core.incomplete(ctx.rollout_id, ctx.model_call_id, IncompleteReason.UPSTREAM_ERROR, ctx.route,
                                     None, detail):
        log.error("upstream failure of call %s could not be recorded", ctx.model_call_id)
    return adapter.error(502, detail, "upstream_error")


async def _engine_error(svc: CaptureServices, call: Call, adapter: DialectAdapter, status: int, content: bytes) -> Response:
    # A 4xx generated nothing, but the harness's turn is lost all the same: the rollout must say why.
    ctx = call.ctx
    reason = IncompleteReason.UPSTREAM_ERROR if status >= 500 else IncompleteReason.ENGINE_REJECTED
    if not await svc.core.incomplete(ctx.rollout_id, ctx.model_call_id, reason, ctx.route, status,
                                     engine_message(content)):
        log.error("engine error %d of call %s could not be recorded", status, ctx.model_call_id)
    return adapter.upstream_error(status, content)
