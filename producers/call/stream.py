"""A streamed generating call: the engine's chunks reach the client as they come, the capture comes last.

Two halves per call: the pump (a task of its own) reads the engine stream under the call's ``Deadlines``,
translates each chunk for the client and queues it; the response (``ClientStream``) hands queued pieces to
the server. Only the terminal event waits until the capture is durable.

Guarantees:
- Deadlines: an engine stream silent for ``stream_idle_timeout_s`` (before its first chunk too) or still
  running after ``engine_timeout_s`` is closed; the call records CallIncomplete(engine_timeout) naming which
  timeout, and the client's stream ends with an error event in its dialect.
- A client that goes away before its stream ended (the server stops taking the body: an http.disconnect, a
  failed send, the request cancelled) is seen by the response itself, however it ended. Until the pump
  starts writing the call's record, it is stopped: the engine stream is closed (vLLM aborts a request whose
  connection closes, so no tokens are generated for nobody) and the call records
  CallIncomplete(client_disconnected) saying how many events and generated tokens the client was handed.
  Never a CallCaptured: the rollout is masked, not delivered with a generation its harness did not get.
- The capture is written only once every content event was handed to the server, and only if the client is
  still there. A client that goes away after that, while the capture is made durable or before the terminal
  event reaches it, keeps the capture: it was handed every content chunk, only the closing events were lost,
  and a call leaves exactly one record.
- The engine failing mid-stream: a broken stream or one that ends without a finish reason is
  CallIncomplete(stream_interrupted), an error event CallIncomplete(upstream_error), a chunk no dialect can
  express CallIncomplete(untranslatable_output); the client gets an error event instead of the terminal one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson
from starlette.responses import Response

from producers.call.client_link import ClientLink, ClientStream
from producers.call.dispatch import (
    SERVED,
    Deadlines,
    EngineFailure,
    StreamWatch,
    record_failure,
    refusal,
    send_chat,
    send_stream,
    settled,
)
from producers.capture.core import Call
from producers.capture.version_clock import VersionClock
from producers.engine import continuation
from producers.engine.chat_stream import ChatStreamAccumulator
from producers.http.replies import durability_error
from schemas.records import IncompleteReason

if TYPE_CHECKING:
    from producers.dialects.base import DialectAdapter, StreamAdapter
    from producers.services import CaptureServices

__all__ = ["stream_call"]

log = logging.getLogger("tokentrail.interceptor")
_ENGINE_ENDED = ("abort", "error")  # finish reasons the core records as failures


async def stream_call(svc: CaptureServices, call: Call, adapter: DialectAdapter, parsed: Any,
                      upstream_body: dict[str, Any], headers: Mapping[str, str | bytes],
                      deadlines: Deadlines, intent: asyncio.Task[bool]) -> Response:
    """Dispatch the streamed call; the answer streams what the pump queues (module docstring).

    The response (its status, then any chunk) starts only once the call's intent is durable: its ack is
    awaited while the engine opens its stream; without it the stream is closed and the call is a 503.
    """
    upstream_body["stream"] = True
    if adapter.spec.stream_usage:  # the translated terminal events report usage
        upstream_body["stream_options"] = {"include_usage": True}
    # convert: vLLM 0.34's derendered chunks into chat chunks, when the call's ids go that way (send_stream)
    upstream, convert = await send_stream(svc, call, upstream_body, headers, deadlines,
                                          include_usage=adapter.spec.stream_usage)
    if not await settled(intent):
        if not isinstance(upstream, EngineFailure):
            await upstream.aclose()  # the engine stops generating for a call nobody may see
        return durability_error(adapter.error)
    if isinstance(upstream, EngineFailure):
        return await record_failure(svc, call, adapter, upstream)
    link = ClientLink()
    link.pump = asyncio.get_running_loop().create_task(
        _pump(svc, call, adapter, parsed, _Engine(upstream, upstream_body, headers), link, deadlines, convert))
    svc.tasks.track(link.pump)
    return ClientStream(link)


class _Engine:
    """The engine side of one streamed call: its current response (a continued call opens several)."""

    __slots__ = ("response", "body", "headers")

    def __init__(self, response: Any, body: dict[str, Any], headers: Mapping[str, str | bytes]) -> None:
        self.response, self.body, self.headers = response, body, headers

    async def aclose(self) -> None:
        await self.response.aclose()


async def _pump(svc: CaptureServices, call: Call, adapter: DialectAdapter, parsed: Any, upstream: _Engine,
                link: ClientLink, deadlines: Deadlines, convert: Any = None) -> None:
    """Read the engine's stream to its end, forward it translated, then write the call's one record."""
    acc = ChatStreamAccumulator()
    out = adapter.stream_adapter(call.response_id, parsed)
    core, ctx = svc.core, call.ctx
    watch = StreamWatch(deadlines)
    broke: tuple[str, str] | None = None
    try:
        # Cancellable here, and only here: by the watch (the engine went silent) and by
        # ClientLink.closed() (the client left).
        try:
            relay_abort = svc.settings.abort_policy == "continue"
            broke = await _relay(upstream.response, acc, out, link, watch, call, core.clock, relay_abort=relay_abort,
                                 convert=convert)
            watch.stop()
            while broke is None and acc.finish_reason == "abort" and svc.settings.abort_policy == "continue" \
                    and call.continued < svc.settings.max_continuations:
                watch = StreamWatch(deadlines)
                broke, went_on = await _continue(svc, call, upstream, acc, out, link, watch, deadlines)
                watch.stop()
                if not went_on:
                    break
            if broke is None and not acc.finished:
                broke = (IncompleteReason.STREAM_INTERRUPTED,
                         f"engine stream ended without a finish_reason after {acc.chunks} chunks")
            if broke is None:
                await link.drained()  # the capture is of what the client was handed, all of it
        except asyncio.CancelledError:
            watch.stop()
            if not link.left and watch.bound is None:
                raise  # neither the client's doing nor the engine's (shutdown): not ours to swallow
            _uncancel()
            if not link.left and watch.bound is not None:
                broke = (IncompleteReason.ENGINE_TIMEOUT,
                         deadlines.expired(watch.bound, f"after {acc.chunks} chunks"))
        link.committed = True
        if link.left:
            await upstream.aclose()  # first: the engine stops generating for nobody
            await core.incomplete(ctx.rollout_id, ctx.model_call_id, IncompleteReason.CLIENT_DISCONNECTED,
                                  ctx.route, None, link.left_detail(acc))
            return
        if broke is not None:
            await upstream.aclose()
            reason, detail = broke
            ok = await core.incomplete(ctx.rollout_id, ctx.model_call_id, reason, ctx.route, None, detail)
            timed_out = reason == IncompleteReason.ENGINE_TIMEOUT
            message = (detail if timed_out else f"the model stream failed ({reason})") + (
                "" if ok else " and was not recorded")
            link.put(out.error(504 if timed_out else 502, message, "engine_timeout" if timed_out else "upstream_error"),
                     link.tokens_handed)
            return
        outcome = await core.complete(call, acc.response(), prepare=out.finish)
        if outcome in SERVED:
            rest, terminal = call.answer
            if rest:
                link.put(rest, _tokens(acc))
            link.put(terminal, _tokens(acc))
        else:
            status, kind, message = refusal(call, outcome)
            link.put(out.error(status, message, kind), link.tokens_handed)
    except Exception as exc:  # never leave the client hanging, never lose the evidence silently
        log.exception("stream capture failed for call %s", ctx.model_call_id)
        link.committed = True
        await core.incomplete(ctx.rollout_id, ctx.model_call_id, IncompleteReason.CAPTURE_EXCEPTION, ctx.route,
                              None, repr(exc))
        link.put(out.error(500, f"capture failed: {exc!r}"), link.tokens_handed)
    finally:
        watch.stop()
        await upstream.aclose()
        link.end()


async def _continue(svc: CaptureServices, call: Call, upstream: _Engine, acc: ChatStreamAccumulator,
                    out: StreamAdapter, link: ClientLink, watch: StreamWatch,
                    deadlines: Deadlines) -> tuple[tuple[str, str] | None, bool]:
    """Continue an aborted stream with the next part (``producers.engine.continuation``), relayed on the same
    client stream. (broke, went on): not going on leaves the abort for the core to record."""
    message = {"tool_calls": list(acc.tool_calls.values())} if acc.tool_calls else None
    body = continuation.continuation_body(upstream.body, list(acc.prompt_token_ids or []), list(acc.token_ids or []),
                                          message, None)
    if isinstance(body, str) or acc.prompt_token_ids is None or acc.token_ids is None:
        log.info("streamed call %s not continued after an abort: %s", call.ctx.model_call_id,
                 body if isinstance(body, str) else "the aborted part carried no token ids")
        return None, False
    call.part_ended(svc.core.clock.label, len(acc.token_ids))
    body["cache_salt"] = svc.core.cache_salt(call, part=call.continued + 1)  # no KV of the old weights
    await upstream.aclose()
    got = await send_chat(svc, call, body, upstream.headers, deadlines, stream=True)
    if isinstance(got, EngineFailure):
        return (got.reason, f"continuation {call.continued + 1}: {got.detail}"), True
    upstream.response = got
    acc.begin_part()
    call.continued += 1
    broke = await _relay(got, acc, out, link, watch, call, svc.core.clock, continued=True,
                         relay_abort=call.continued < svc.settings.max_continuations)
    if broke is None and acc.part_prompt_error:
        broke = IncompleteReason.PREFIX_NOT_APPLIED, f"continuation {call.continued}: {acc.part_prompt_error}"
    return broke, True


def _uncancel() -> None:
    # The cancellation was ours (the client left, or the engine went silent) and is handled: later
    # timeouts (the publisher's) must work as usual.
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()


def _tokens(acc: ChatStreamAccumulator) -> int:
    return len(acc.token_ids) if acc.token_ids else 0


async def _relay(upstream: Any, acc: ChatStreamAccumulator, out: StreamAdapter, link: ClientLink,
                 watch: StreamWatch, call: Call, clock: VersionClock, *,
                 continued: bool = False, relay_abort: bool = False, convert: Any = None) -> tuple[str, str] | None:
    """Forward the engine's chunks as they come; (reason, detail) when the stream cannot be completed.

    Each chunk that carries tokens is stamped with the announced version (``producers.capture.version_clock``).
    ``convert`` turns a generate route's chunk into a chat chunk (``DerenderChunks.chat_chunk``; one call per
    chunk on that route, none on the chat route); a chunk it refuses is CallIncomplete(partial_token_metadata).
    """
    versions = call.versions
    lines = upstream.aiter_lines()
    while True:
        try:
            line = await anext(lines)
        except StopAsyncIteration:
            return None
        except Exception as exc:  # any transport failure, httpx's or an in-process upstream's
            return IncompleteReason.STREAM_INTERRUPTED, f"engine stream broke after {acc.chunks} chunks: {exc!r}"
        watch.seen()
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
        if convert is not None:
            try:
                chunk = convert(chunk)
            except ValueError as exc:
                return IncompleteReason.PARTIAL_TOKEN_METADATA, f"generate chunk {acc.chunks + 1}: {exc}"
        if continued:
            _drop_role(chunk)  # the harness's stream already opened its message
        before = len(acc.token_ids) if acc.token_ids else 0
        try:  # the one chunk reader (producers.dialects.chat_chunks) refuses what no dialect can express
            read = acc.feed(chunk)
        except ValueError as exc:
            return (IncompleteReason.UNTRANSLATABLE_OUTPUT,
                    f"engine chunk {acc.chunks + 1} cannot be expressed in the client's dialect: {exc}")
        if versions is not None and acc.token_ids is not None and len(acc.token_ids) > before:
            versions.observe(clock.label, before)  # this chunk's tokens reached us under the current version
        part_ended = acc.finish_reason == "abort" and relay_abort
        if part_ended:  # to be continued: the harness gets this part's last tokens, never its finish
            for choice in chunk.get("choices") or ():
                if isinstance(choice, dict):
                    choice["finish_reason"] = None
                    choice.pop("stop_reason", None)
            read = read._replace(finish_reason=None, stop_reason=None)
        elif acc.finish_reason in _ENGINE_ENDED:
            return None  # the core records it; the harness gets an error event, not this chunk
        try:
            piece = out.feed(chunk, read)
        except ValueError as exc:
            return (IncompleteReason.UNTRANSLATABLE_OUTPUT,
                    f"engine chunk {acc.chunks} cannot be expressed in the client's dialect: {exc}")
        if piece:
            link.put(piece, _tokens(acc))
        if part_ended:
            return None


def _drop_role(chunk: dict[str, Any]) -> None:
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if isinstance(delta, dict):
            delta.pop("role", None)
