"""The engine side of a generating call: dispatch under deadlines, and the evidence of each way it fails.

``Deadlines`` bounds one call from its dispatch: all of it by ``engine_timeout_s``, and a stream's silence
(before its first chunk, which waits for the prefill, and between two chunks) by ``stream_idle_timeout_s``.
Each single wait on the engine is one ``asyncio.timeout_at``; a stream is watched by one ``StreamWatch``
timer per call, re-armed only when it fires, so a chunk costs one clock read (a timer per read measured
~7 us, ~14 ms of CPU for a 1000-token stream). An expired wait is cancelled, the engine response is closed (vLLM aborts a request whose
connection closes; in process, the request's task is cancelled) and the call records
CallIncomplete(engine_timeout) naming the timeout, its value and the setting that raises it; the harness gets
a 504 (or, mid-stream, an error event). These deadlines are the interceptor's own: httpx's timeouts do not
apply to the in-process engine of the vLLM middleware.

``send_stream`` sends a streamed call, its supplied ids vLLM 0.34's way when the engine offers it (render, then
``/inference/v1/generate``).
``send_chat`` dispatches the chat request and returns the engine's response (status < 400, body unread) or
an ``EngineFailure``; it only talks to the engine, so a caller may cancel it (the client left) without
cutting a record short. ``record_failure`` records the failure and answers the harness: no answer at all
(whatever the transport raised) or a 5xx is CallIncomplete(upstream_error), a 4xx
CallIncomplete(engine_rejected), after one retry with a smaller ``max_tokens`` when the engine refused the
budget for its context window and the window still has room; a deadline CallIncomplete(engine_timeout).

``REFUSED`` is how each refused outcome of ``CaptureCore.complete`` reaches the harness, streaming or not.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from starlette.responses import Response

from producers.capture.core import Call, Outcome
from producers.engine import derender
from producers.engine.direct import EngineClient
from producers.engine.info import (
    CHAT_PATH,
    RENDER_PATH,
    EngineCallError,
    context_refusal,
    engine_message,
    max_tokens_key,
    post_json,
    prompt_tokens,
)
from producers.settings import InterceptorSettings
from schemas.records import IncompleteReason, PrefixRoute

if TYPE_CHECKING:
    from producers.dialects.base import DialectAdapter
    from producers.services import CaptureServices

__all__ = ["REFUSED", "SERVED", "Deadlines", "EngineFailure", "StreamWatch", "auth_of", "record_failure", "refusal",
           "send_chat", "send_stream"]

log = logging.getLogger("tokentrail.interceptor")
SERVED = (Outcome.CAPTURED, Outcome.INCOMPLETE)
# How each refused outcome reaches the harness: status, error type, message.
REFUSED = {
    Outcome.ABORTED: (503, "engine_aborted", "the engine aborted the generation (it pauses in-flight requests for "
                                             "a weight update); retry the call"),
    Outcome.ENGINE_FAILED: (502, "upstream_error", "the engine failed the generation; retry the call"),
    Outcome.UNTRANSLATABLE: (502, "upstream_error", "the model's answer cannot be expressed in this API"),
    Outcome.PREFIX_FAILED: (502, "prefix_not_applied", "the engine ignored the supplied prompt ids; the call was "
                                                       "not served"),
    Outcome.NOT_DURABLE: (503, "capture_unavailable", "tokentrail could not make the capture durable; retry the call"),
}


def refusal(call: Call, outcome: Outcome) -> tuple[int, str, str]:
    """(status, error type, message) of a refused outcome; an untranslatable answer names what failed."""
    status, kind, message = REFUSED[outcome]
    if outcome is Outcome.UNTRANSLATABLE and call.failure:
        message = f"{message}: {call.failure}"
    return status, kind, message


@dataclass(slots=True)
class Deadlines:
    """The deadlines of one engine call, in event-loop time, from its dispatch."""

    total_s: float
    idle_s: float
    end: float  # the whole call must be over by then

    @classmethod
    def start(cls, settings: InterceptorSettings) -> Deadlines:
        now = asyncio.get_running_loop().time()
        return cls(settings.engine_timeout_s, settings.stream_idle_timeout_s, now + settings.engine_timeout_s)

    def next_chunk_by(self, now: float) -> float:
        """When the stream's next bytes must have come: the silence bound, within the whole call's."""
        return min(now + self.idle_s, self.end)

    def expired(self, bound: float, what: str) -> str:
        """The detail of a wait that ran out at ``bound``: which timeout, its value, what was waited for."""
        if bound >= self.end:
            return (f"the engine call took longer than engine_timeout_s={self.total_s:g}s ({what}); the engine "
                    "request was closed. If generations this long are expected, raise --engine-timeout-s "
                    "(TOKENTRAIL_ENGINE_TIMEOUT_S in the vLLM middleware)")
        return (f"the engine stream was silent for stream_idle_timeout_s={self.idle_s:g}s ({what}); the engine "
                "request was closed. If prefills or pauses this long are expected, raise --stream-idle-timeout-s "
                "(TOKENTRAIL_STREAM_IDLE_TIMEOUT_S in the vLLM middleware)")


class StreamWatch:
    """Cancels the task reading a stream once it is silent past ``Deadlines``' bounds; ``bound`` says which.

    The reader calls ``seen()`` after each read (a clock read); the one timer checks, when it fires, whether
    anything came meanwhile and re-arms itself at the new bound if so. ``stop()`` before the reader does
    anything else: the cancellation must only ever reach its read.
    """

    __slots__ = ("bound", "_deadlines", "_handle", "_last", "_loop", "_task")

    def __init__(self, deadlines: Deadlines) -> None:
        self._deadlines = deadlines
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self._last = self._loop.time()
        self.bound: float | None = None  # set when it fired: the bound that was passed
        self._handle = self._loop.call_at(deadlines.next_chunk_by(self._last), self._check)

    def seen(self) -> None:
        self._last = self._loop.time()

    def _check(self) -> None:
        bound = self._deadlines.next_chunk_by(self._last)
        if self._loop.time() >= bound:
            self.bound = bound
            if self._task is not None:
                self._task.cancel()
        else:
            self._handle = self._loop.call_at(bound, self._check)

    def stop(self) -> None:
        self._handle.cancel()


def auth_of(headers: Mapping[str, str | bytes]) -> dict[str, str | bytes]:
    return {"authorization": headers["authorization"]} if "authorization" in headers else {}


@dataclass(frozen=True, slots=True)
class EngineFailure:
    """Why the engine gave no usable answer: the CallIncomplete to record, and what the harness is told."""

    reason: str
    detail: str
    status: int | None = None  # the engine's HTTP status, when it answered one
    content: bytes | None = None  # the engine's error body, passed on to the harness in its dialect

    @classmethod
    def from_status(cls, status: int, content: bytes) -> EngineFailure:
        # A 4xx generated nothing, but the harness's turn is lost all the same: the rollout must say why.
        reason = IncompleteReason.UPSTREAM_ERROR if status >= 500 else IncompleteReason.ENGINE_REJECTED
        return cls(reason, engine_message(content), status, content)


async def send_stream(svc: CaptureServices, call: Call, body: dict[str, Any], headers: Mapping[str, str | bytes],
                      deadlines: Deadlines, *, include_usage: bool) -> tuple[Any, Callable[[dict], dict] | None]:
    """A streamed call's engine request: ``send_chat``'s answer, and the chunk translator when it went
    vLLM 0.34's way (``derender.route_for``: supplied ids, an engine that streams derendered generations).

    That way ``body`` (the chat request) is rendered and its GenerateRequest sent to
    ``/inference/v1/generate`` with the ids in, streamed and derendered (``producers.engine.derender``).
    A render that fails or answers another shape sends ``body`` on the chat route instead (ids as
    kv_transfer_params, no translator): the call is served the 0.32 way, and its capture says so.
    """
    if derender.route_for(call.supplied_prefix is not None, True,
                          svc.core.catalog.streams_derender) is not PrefixRoute.GENERATE:
        return await send_chat(svc, call, body, headers, deadlines, stream=True), None
    try:
        async with asyncio.timeout_at(deadlines.end):
            rendered = await post_json(svc.upstream, RENDER_PATH, auth_of(headers),
                                       {k: v for k, v in body.items() if k != "kv_transfer_params"})
        request = derender.generate_request(rendered, call.supplied_prefix or [], include_usage=include_usage)
    except (EngineCallError, ValueError, TimeoutError) as exc:
        log.warning("call %s goes the kv_transfer_params way: rendering it for %s failed (%s)",
                    call.ctx.model_call_id, derender.GENERATE_PATH, exc or "timed out")
        return await send_chat(svc, call, body, headers, deadlines, stream=True), None
    call.prefix_route = PrefixRoute.GENERATE
    answer = await send_chat(svc, call, request, headers, deadlines, stream=True, path=derender.GENERATE_PATH)
    chunks = derender.DerenderChunks(str(rendered.get("request_id") or call.response_id), str(body.get("model") or ""),
                                     int(time.time()))
    return answer, chunks.chat_chunk


async def send_chat(svc: CaptureServices, call: Call, body: dict[str, Any], headers: Mapping[str, str | bytes],
                    deadlines: Deadlines, *, stream: bool, path: str = CHAT_PATH) -> Any:
    """The engine's response (status < 400, body unread), or an ``EngineFailure``; engine I/O only, no record.

    The answer's headers must come within the call's deadline and, for a stream, within its silence bound.
    Cancelled (the client left), it closes what it opened. Only the chat route (``path``) is retried with a
    smaller budget after a context refusal: a GenerateRequest's budget is the render's.
    """
    loop = asyncio.get_running_loop()
    for attempt in (1, 2):
        by = deadlines.next_chunk_by(loop.time()) if stream else deadlines.end
        try:
            async with asyncio.timeout_at(by):
                # httpx takes str and bytes header values mixed; its type hint says one or the other.
                # A large body's encode (~2 ms per MB) leaves the loop with the rest of its preparation.
                content = await svc.bodies.offload(orjson.dumps, body) if call.large else orjson.dumps(body)
                # A JSON answer skips httpx's layers where the proxy can (producers.engine.direct).
                upstream: Any = (await client.post_direct(path, content, headers)
                                 if not stream and isinstance(client := svc.upstream, EngineClient) else None)
                if upstream is None:
                    request = svc.upstream.build_request("POST", path, content=content,
                                                         headers=headers)  # type: ignore[arg-type]
                    upstream = await svc.upstream.send(request, stream=True)
        except TimeoutError:
            return EngineFailure(IncompleteReason.ENGINE_TIMEOUT, deadlines.expired(by, "waiting for its answer"))
        except Exception as exc:
            return EngineFailure(IncompleteReason.UPSTREAM_ERROR, f"model server unreachable: {exc!r}")
        if upstream.status_code < 400:
            return upstream
        budget = None
        try:
            async with asyncio.timeout_at(deadlines.end):
                content = await upstream.aread()
                if attempt == 1 and upstream.status_code == 400 and path == CHAT_PATH:
                    budget = await _context_budget(svc, call, body, headers, content)
        except TimeoutError:
            return EngineFailure(IncompleteReason.ENGINE_TIMEOUT,
                                 deadlines.expired(deadlines.end, "reading its error answer"))
        except Exception as exc:
            return EngineFailure(IncompleteReason.UPSTREAM_ERROR,
                                 f"model server error {upstream.status_code} unreadable: {exc!r}")
        finally:
            await upstream.aclose()
        if budget is not None:
            svc.core.lower_max_tokens(call, body, budget)
            continue
        return EngineFailure.from_status(upstream.status_code, content)
    raise AssertionError("unreachable: the second attempt always returns")


async def _context_budget(svc: CaptureServices, call: Call, body: dict[str, Any], headers: Mapping[str, str | bytes],
                          content: bytes) -> int | None:
    """A max_tokens the engine can serve after it refused ``body`` for its context window; None: none can."""
    refusal_ = context_refusal(engine_message(content))
    sent = body.get(max_tokens_key(body))
    if refusal_ is None or not isinstance(sent, int):
        return None
    info = svc.core.catalog.info
    limit = refusal_.max_model_len or (info.max_model_len(body.get("model")) if info else None)
    if limit is None:
        return None
    if refusal_.over_limit:
        budget = limit  # the engine then caps it at what the prompt leaves (vLLM get_max_tokens)
    else:
        used = refusal_.input_tokens
        if used is None:
            try:
                used = len(call.supplied_prefix) if call.supplied_prefix else await prompt_tokens(
                    svc.upstream, auth_of(headers), body)
            except EngineCallError as exc:
                log.warning("cannot measure the prompt of call %s to fit max_tokens: %s", call.ctx.model_call_id, exc)
                return None
        budget = limit - used
    return budget if 1 <= budget < sent else None


async def settled(intent: asyncio.Task[bool]) -> bool:
    """Whether the call's CallStarted intent is durable, once that is known (``CaptureCore.announce``).

    The write itself is shielded: a caller cancelled meanwhile (the client left) leaves it to finish, so the
    intent stays ahead of the call's later records; an unexpected failure to write it counts as not durable.
    """
    try:
        return await asyncio.shield(intent)
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("the intent of a call could not be written")
        return False


async def record_failure(svc: CaptureServices, call: Call, adapter: DialectAdapter, failure: EngineFailure) -> Response:
    """Record the failure's CallIncomplete, then the harness's answer: a 504, a 502, or the engine's own error."""
    ctx = call.ctx
    if not await svc.core.incomplete(ctx.rollout_id, ctx.model_call_id, failure.reason, ctx.route, failure.status,
                                     failure.detail):
        log.error("%s of call %s could not be recorded", failure.reason, ctx.model_call_id)
    if failure.content is not None and failure.status is not None:
        return adapter.upstream_error(failure.status, failure.content)
    if failure.reason == IncompleteReason.ENGINE_TIMEOUT:
        return adapter.error(504, failure.detail, "engine_timeout")
    return adapter.error(502, failure.detail, "upstream_error")
