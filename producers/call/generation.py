"""``handle_generation``: the HTTP side of one captured call (``CaptureServices`` and a dialect adapter only).

Before dispatch the request is fitted to the engine (``CaptureCore.begin``: a model it serves, a budget within
``max_model_len``), its CallStarted intent is handed to the writer (``CaptureCore.announce``) and, with prefix
supply, it is given its exact prompt ids (``producers.engine.prefix_supply``). The intent is produced before the
engine sees the request, so it precedes every other record of the call on the partition, and a rollout frozen
while the call is in flight (the harness gave up on a stalled engine, or was still waiting) is incomplete
(``intent_without_capture``) unless the call's capture arrived first: it is never delivered unmasked without it.
Its ack (Kafka's, or the fsynced spool) is awaited while the engine works, not before: the harness gets no byte
of an answer (no response status, no chunk) until the intent is durable, and an intent that cannot be made
durable fails the call with a 503 (the engine request is closed; nothing else is recorded). One durable ack,
the capture's, stays on the critical path.

Non-streaming: the engine's answer, awaited within ``engine_timeout_s`` (``producers.call.dispatch``), is
judged, translated, made durable, then returned; a client that leaves while the engine works stops the call
(``ClientWatch``: CallIncomplete(client_disconnected), never a capture of an answer it did not get). Streaming: ``producers.call.stream`` (chunks reach the
client as the engine produces them; only the terminal event waits until the capture is durable; a client
that leaves first stops the call). Either way a call leaves exactly one record (``producers.capture.core``),
besides its intent.

A request that cannot be read (not JSON, not an object, nested deeper than
``producers.http.json_limits.MAX_JSON_DEPTH``) or that the dialect refuses is a 400 in the caller's dialect naming
the field; nothing is recorded and nothing reaches the engine.

A body over ``producers.call.large_bodies.LARGE_BODY_BYTES`` is read (``read_request``), described
(``CaptureCore.describe``), encoded for the engine and, once the call is over, freed in the large-body lane's
thread, so the event loop serves other requests meanwhile; the same functions run, with the same results and
errors. A smaller one's are on the loop.

Engine errors are recorded with the engine's message (``producers.call.dispatch``): no answer at all or a 5xx
is CallIncomplete(upstream_error), a 4xx CallIncomplete(engine_rejected), no answer within
``engine_timeout_s`` CallIncomplete(engine_timeout) and a 504. An aborted generation (vLLM pauses in-flight
requests for a weight sync) is CallIncomplete(aborted) and a 503 the harness can retry. Anything else that
goes wrong is CallIncomplete(capture_exception), a 500 naming it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

import orjson
from starlette.responses import Response

from producers.call.dispatch import (
    SERVED,
    Deadlines,
    EngineFailure,
    auth_of,
    record_failure,
    refusal,
    send_chat,
    settled,
)
from producers.call.large_bodies import LARGE_BODY_BYTES, LargeCall
from producers.call.stream import stream_call
from producers.capture.core import Call, Outcome
from producers.dialects.common import json_type
from producers.engine import continuation, prefix_supply
from producers.engine.info import EngineCallError, render_ids
from producers.http.json_in_steps import load_json_in_steps
from producers.http.json_limits import load_json, nesting_problem
from producers.http.replies import durability_error
from schemas.records import IncompleteReason

if TYPE_CHECKING:
    from starlette.requests import Request

    from producers.dialects.base import DialectAdapter
    from producers.services import CaptureServices

__all__ = ["ClientWatch", "handle_generation", "read_request"]

log = logging.getLogger("tokentrail.interceptor")


async def handle_generation(svc: CaptureServices, request: Request, rollout_id: str, api_path: str,
                            adapter: DialectAdapter) -> Response:
    started = time.perf_counter()
    raw = await request.body()
    if len(raw) <= LARGE_BODY_BYTES:
        return await _generation(svc, request, raw, rollout_id, api_path, adapter, started, None)
    large = svc.bodies.call()  # its preparation leaves the loop (producers.call.large_bodies)
    try:
        return await _generation(svc, request, raw, rollout_id, api_path, adapter, started, large)
    finally:
        large.ended()


def read_request(raw: bytes, adapter: DialectAdapter, api_path: str = "", query: str = "") -> tuple[dict[str, Any], Any]:
    """The request body and the dialect's reading of it (``api_path`` and ``query`` are the call's, for a dialect
    whose path or query says part of the request); ValueError (or what the dialect's checks missed) when it
    cannot be read. Pure: a large body's runs in a worker thread."""
    # A large body's parse runs in the lane's thread in steps, so the loop gets the GIL between them.
    body = (load_json if len(raw) <= LARGE_BODY_BYTES else load_json_in_steps)(raw, "the request body")
    if not isinstance(body, dict):
        raise ValueError(f"the request body must be a JSON object, got a JSON {json_type(body)}")
    problem = nesting_problem(body)
    if problem is not None:
        raise ValueError(problem)
    return body, adapter.parse(body, api_path=api_path, query=query)


async def _generation(svc: CaptureServices, request: Request, raw: bytes, rollout_id: str, api_path: str,
                      adapter: DialectAdapter, started: float, large: LargeCall | None) -> Response:
    """One call; ``large``: the body is large, its preparation runs in the lane's threads."""
    what = f"invalid {adapter.spec.wire.value.lower()} request"
    try:
        query = bytes(request.scope.get("query_string") or b"").decode("latin-1")
        body, parsed = (read_request(raw, adapter, api_path, query) if large is None
                        else await large.offload(read_request, raw, adapter, api_path, query))
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
    intent: asyncio.Task[bool] | None = None
    try:
        try:  # a stalled engine may not even list its models: go on without, the call then times out
            async with asyncio.timeout(svc.settings.stream_idle_timeout_s):
                engine = await core.catalog.get(svc.upstream, auth_of(upstream_headers))
        except TimeoutError:
            engine = None
        described = (core.describe(rollout_id, api_path, adapter.spec, parsed, body, headers, engine) if large is None
                     else await large.offload(core.describe, rollout_id, api_path, adapter.spec, parsed, body,
                                              headers, engine))
        call = core.begin(described, started)
        call.large = large is not None  # its upstream encode leaves the loop too (producers.call.dispatch)
        intent = await core.announce(call)  # produced now; durable before the harness sees anything
        deadlines = Deadlines.start(svc.settings)  # the engine's time starts with its first request
        if call.prefix_requested:
            await _supply_prefix(svc, call, upstream_headers, deadlines)
        upstream_body = core.upstream_body(call)
        if not parsed.stream:
            return await _complete(svc, call, adapter, parsed, upstream_body, upstream_headers, deadlines,
                                   request.receive, intent)
        return await stream_call(svc, call, adapter, parsed, upstream_body, upstream_headers, deadlines, intent)
    except Exception as exc:  # never an unexplained 500: record what broke, then say so
        log.exception("capture of a call of rollout %s failed", rollout_id)
        if intent is not None and not await settled(intent):
            return durability_error(adapter.error)
        call_id = call.ctx.model_call_id if call is not None else None
        await core.incomplete(rollout_id, call_id, IncompleteReason.CAPTURE_EXCEPTION, api_path, None, repr(exc))
        return adapter.error(500, f"capture failed: {exc!r}", "capture_error")


async def _supply_prefix(svc: CaptureServices, call: Call, headers: Mapping[str, str | bytes],
                         deadlines: Deadlines) -> None:
    """Put the exact prompt ids on ``call`` when they can be built in time; otherwise it is sent as rendered."""
    why = prefix_supply.ineligible(call.body)
    if not why:
        through_parent, full = prefix_supply.render_bodies(call.body)
        parent = call.resolution.parent
        assert parent is not None and parent.cum_tokens is not None  # begin() set prefix_requested
        bodies = [through_parent, full] + ([] if parent.ends_on_stop else [prefix_supply.emptied_body(through_parent)])
        auth = auth_of(headers)
        try:
            async with asyncio.timeout_at(deadlines.end):
                rendered = await asyncio.gather(*(render_ids(svc.upstream, auth, b) for b in bodies),
                                                return_exceptions=True)
        except TimeoutError:  # the call itself then times out on the same deadline, recorded
            rendered = [EngineCallError(deadlines.expired(deadlines.end, "rendering the prompt"))]
        failed = next((r for r in rendered if isinstance(r, BaseException)), None)
        if failed is not None:
            if not isinstance(failed, EngineCallError):
                raise failed
            why = f"render failed: {failed}"
        else:
            ids = cast("list[list[int]]", rendered)  # none failed
            result = prefix_supply.splice(parent.cum_tokens.tolist(), *ids)
            call.supplied_prefix, why = result.ids, result.reason
    if why:
        log.info("prompt ids not supplied for call %s: %s", call.ctx.model_call_id, why)


async def _complete(svc: CaptureServices, call: Call, adapter: DialectAdapter, parsed: Any,
                    upstream_body: dict[str, Any], headers: Mapping[str, str | bytes], deadlines: Deadlines,
                    receive: Any, intent: asyncio.Task[bool]) -> Response:
    upstream_body["stream"] = False
    sent = time.perf_counter()
    watch = ClientWatch(receive)
    upstream: Any = None
    got: Any = None
    try:
        with watch.armed():  # engine I/O only: a client that leaves now cancels it
            got = await send_chat(svc, call, upstream_body, headers, deadlines, stream=False)
            if not isinstance(got, EngineFailure):
                upstream = got  # closed below, however this ends
                got = await _read_answer(upstream, deadlines)
            if not isinstance(got, EngineFailure):
                got = _answer_json(got)
            if not isinstance(got, EngineFailure) and svc.settings.abort_policy == "continue":
                got = await _continued(svc, call, upstream_body, headers, deadlines, got)
    except asyncio.CancelledError:
        if not watch.left:
            raise  # not the client's doing (shutdown)
        watch.handled()
    finally:
        watch.stop()  # from here on a client that leaves keeps the capture (ClientWatch)
        if upstream is not None:
            await upstream.aclose()  # before any record: an abandoned or timed-out engine stops generating
    if not await settled(intent):  # the engine worked meanwhile; without a durable intent nothing is served
        return durability_error(adapter.error)
    if watch.left:
        return await _client_left(svc, call, adapter)
    if isinstance(got, EngineFailure):
        return await record_failure(svc, call, adapter, got)
    data = got
    engine_s = time.perf_counter() - sent
    outcome = await svc.core.complete(call, data, prepare=lambda: adapter.render(data, call.response_id, parsed))
    if outcome is Outcome.NOT_DURABLE:
        return durability_error(adapter.error)
    if outcome not in SERVED:
        return _refused(adapter, call, outcome)
    response: Response = call.answer
    # Server-Timing (RFC-style): the engine's share and ours, durable ack included.
    ours = time.perf_counter() - call.started - engine_s
    svc.metrics.overhead_seconds.observe(ours)
    response.headers["server-timing"] = f"engine;dur={engine_s * 1000:.3f}, tokentrail;dur={ours * 1000:.3f}"
    return response


def _answer_json(content: bytes) -> dict[str, Any] | EngineFailure:
    try:
        data = orjson.loads(content)
        if not isinstance(data, dict):
            raise ValueError(f"a JSON {type(data).__name__}, not an object")
    except ValueError as exc:
        return EngineFailure(IncompleteReason.UPSTREAM_ERROR, f"model server answered with invalid JSON: {exc}")
    return data


async def _continued(svc: CaptureServices, call: Call, body: dict[str, Any], headers: Mapping[str, str | bytes],
                     deadlines: Deadlines, data: dict[str, Any]) -> dict[str, Any] | EngineFailure:
    """``data``, or, while the engine aborted it, the answer joined with its continuation
    (``producers.engine.continuation``); a part that cannot be continued is returned as it is (aborted)."""
    while _finish(data) == "abort" and call.continued < svc.settings.max_continuations:
        part = continuation.part_of(data)
        if part is None:
            return data  # no tokens to continue from: recorded as aborted
        prompt, generated, choice = part
        call.part_ended(svc.core.clock.label, len(generated))
        nxt = continuation.continuation_body(body, prompt, generated, choice.get("message"),
                                             choice.get("routed_experts"))
        if isinstance(nxt, str):
            log.info("call %s not continued after an abort: %s", call.ctx.model_call_id, nxt)
            return data
        nxt["cache_salt"] = svc.core.cache_salt(call, part=call.continued + 1)  # no KV of the old weights
        upstream = await send_chat(svc, call, nxt, headers, deadlines, stream=False)
        if isinstance(upstream, EngineFailure):
            return upstream
        try:
            content = await _read_answer(upstream, deadlines)
        finally:
            await upstream.aclose()
        if isinstance(content, EngineFailure):
            return content
        second = _answer_json(content)
        if isinstance(second, EngineFailure):
            return second
        wrong = continuation.check_prompt(second.get("prompt_token_ids"), nxt["kv_transfer_params"]["prompt_token_ids"])
        if wrong:
            return EngineFailure(IncompleteReason.PREFIX_NOT_APPLIED, f"continuation {call.continued + 1}: {wrong}")
        data = continuation.join_answers(data, second)
        call.continued += 1
    return data


def _finish(data: dict[str, Any]) -> Any:
    choices = data.get("choices")
    return choices[0].get("finish_reason") if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None


async def _read_answer(upstream: Any, deadlines: Deadlines) -> bytes | EngineFailure:
    try:
        async with asyncio.timeout_at(deadlines.end):
            return await upstream.aread()
    except TimeoutError:
        return EngineFailure(IncompleteReason.ENGINE_TIMEOUT, deadlines.expired(deadlines.end, "reading its answer"))
    except Exception as exc:
        return EngineFailure(IncompleteReason.UPSTREAM_ERROR, f"reading the model server's answer failed: {exc!r}")


async def _client_left(svc: CaptureServices, call: Call, adapter: DialectAdapter) -> Response:
    """The harness went away before its answer: no capture of an answer it never got (nobody reads this)."""
    ctx = call.ctx
    detail = ("the client disconnected while the engine was answering (not streamed): the engine request was "
              "closed (the engine aborts it) and nothing was captured")
    await svc.core.incomplete(ctx.rollout_id, ctx.model_call_id, IncompleteReason.CLIENT_DISCONNECTED, ctx.route,
                              None, detail)
    return adapter.error(499, detail, "client_disconnected")


def _refused(adapter: DialectAdapter, call: Call, outcome: Outcome) -> Response:
    status, kind, message = refusal(call, outcome)
    response = adapter.error(status, message, kind)
    if outcome is Outcome.ABORTED:
        # The OpenAI and Anthropic SDKs read these: retry, after a moment.
        response.headers["x-should-retry"] = "true"
        response.headers["retry-after"] = "1"
    return response


class ClientWatch:
    """Notices a non-streaming call's client going away while the engine works on its answer.

    A non-streaming answer goes back only after its capture is durable, so a harness that gave up on a
    slow engine (its own request timeout) would otherwise leave a CallCaptured of an answer it never got,
    delivered unmasked. The watch reads the request's ``receive`` for ``http.disconnect`` (the body was
    read before, so nothing else can come). While ``armed`` (only around engine I/O, which holds no
    half-written record) a disconnect cancels the waiting task; the caller closes the engine request
    (vLLM aborts it) and records CallIncomplete(client_disconnected). A disconnect while not armed is
    remembered in ``left``; once ``stop``ped (before the capture is written) a client gone later keeps
    the capture, as a streamed call's does.
    """

    __slots__ = ("left", "_armed", "_task", "_watcher")

    def __init__(self, receive: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        self.left = False
        self._armed = False
        self._task = asyncio.current_task()
        self._watcher = asyncio.ensure_future(self._watch(receive))

    async def _watch(self, receive: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        try:
            while (await receive()).get("type") != "http.disconnect":
                pass
        except Exception:  # a server whose receive fails: nothing is known of the client, assume nothing
            return
        self.left = True
        if self._armed and self._task is not None:
            self._task.cancel()

    @contextmanager
    def armed(self) -> Iterator[None]:
        """Around engine I/O: a client leaving now cancels it (raised at once if it already left)."""
        if self.left:
            raise asyncio.CancelledError("the client disconnected")
        self._armed = True
        try:
            yield
        finally:
            self._armed = False

    def handled(self) -> None:
        """The caller caught the cancellation this watch caused: later timeouts must work as usual."""
        if self._task is not None and self._task.cancelling():
            self._task.uncancel()

    def stop(self) -> None:
        self._watcher.cancel()
