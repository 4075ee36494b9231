"""A harness that goes away mid-stream leaves a trace: CallIncomplete(client_disconnected) saying what it was
handed, never a CallCaptured, and the engine stream is closed (no tokens generated for nobody). Standalone
and as vLLM middleware; by http.disconnect (uvicorn, ASGI 2.3) or by a send that fails (ASGI 2.4)."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest

from producers.http.app import Interceptor
from producers.middleware import TokentrailMiddleware
from producers.settings import InterceptorSettings
from schemas.records import CallCaptured, CallIncomplete, CallStarted
from tests.unit.producers import raw_asgi
from tests.unit.producers.stalling_engine import StallingEngine

CHAT = b"/ng-rollout/gone-1/training-token-capture/v1/chat/completions"
MESSAGES = b"/ng-rollout/gone-1/training-token-capture/v1/messages"
BODIES = {CHAT: {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True},
          MESSAGES: {"model": "claude", "max_tokens": 99, "stream": True,
                     "messages": [{"role": "user", "content": "hi"}]}}
N_TOKENS = 400


async def _record(publisher) -> CallIncomplete | CallCaptured:
    """The call's one record, once the pump wrote it (it runs on after the response is over)."""
    for _ in range(300):
        if publisher.events:
            break
        await asyncio.sleep(0.01)
    (event,) = publisher.events
    (intent,) = publisher.intents
    assert isinstance(intent.body, CallStarted) and intent.body.model_call_id == event.body.model_call_id
    return event.body


async def _leave_after(app, path: bytes, events: int, how: str) -> bytes:
    """Stream ``path`` and go away once ``events`` SSE events arrived; what the client got."""
    gone = asyncio.Event()
    got: list[bytes] = []

    def on_body(chunk: bytes) -> None:
        got.append(chunk)
        if sum(c.count(b"data:") for c in got) >= events:
            gone.set()

    kwargs = {"disconnect": gone} if how == "disconnect" else {"send_fails": gone, "spec_version": "2.4"}
    with contextlib.suppress(Exception):  # a failed send ends the request with ClientDisconnect
        await raw_asgi.call(app, "POST", path, body=json.dumps(BODIES[path]).encode(), on_body=on_body, **kwargs)
    return b"".join(got)


@pytest.fixture
async def standalone(publisher):
    engine = StallingEngine(n_tokens=N_TOKENS, interval=0.005)
    settings = InterceptorSettings(upstream_url="http://engine", bootstrap="unused:9092")
    app = Interceptor(settings, publisher=publisher, upstream=engine.client())  # type: ignore[arg-type]
    await app.startup()
    yield app, engine
    await app.shutdown()


@pytest.mark.parametrize("how", ["disconnect", "send-fails"])
@pytest.mark.parametrize("path", [CHAT, MESSAGES], ids=["chat", "anthropic"])
async def test_a_client_that_leaves_mid_stream_is_recorded_and_its_engine_stream_closed(standalone, publisher,
                                                                                       how, path):
    app, engine = standalone
    got = await _leave_after(app, path, events=3, how=how)
    assert b"[DONE]" not in got and b"message_stop" not in got
    marker = await _record(publisher)
    assert isinstance(marker, CallIncomplete) and marker.reason == "client_disconnected"
    assert "the client disconnected before the end of its stream" in marker.detail
    assert "generated token(s)" in marker.detail and "nothing was captured" in marker.detail
    await asyncio.wait_for(engine.closed.wait(), 1.0)
    assert engine.produced < N_TOKENS, "the engine generated the whole answer for nobody"


async def test_the_detail_counts_what_the_client_was_handed(standalone, publisher):
    app, _ = standalone
    await _leave_after(app, CHAT, events=4, how="disconnect")  # the role chunk, then token chunks
    marker = await _record(publisher)
    handed = int(marker.detail.split("handed ")[1].split(" of")[0])
    tokens = int(marker.detail.split("event(s), ")[1].split(" generated")[0])
    assert handed >= 4 and tokens == handed - 1  # each event after the first carried one token


async def test_a_client_that_leaves_while_its_capture_is_made_durable_keeps_the_capture(publisher):
    # The documented edge: every content event was handed to the server before the capture write
    # began; a client gone after that keeps the capture (only the closing events were lost).
    engine = StallingEngine(n_tokens=3, interval=0.05)  # time to hold the capture's ack once the intent's is in
    app = Interceptor(InterceptorSettings(upstream_url="http://engine", bootstrap="unused:9092"),
                      publisher=publisher, upstream=engine.client())  # type: ignore[arg-type]
    await app.startup()
    gone = asyncio.Event()
    got: list[bytes] = []

    async def hold_the_capture() -> None:
        while not publisher.intents:
            await asyncio.sleep(0.001)
        publisher.gate = asyncio.Event()  # the intent is acknowledged; the capture's ack waits
        while b'"finish_reason":"stop"' not in b"".join(got):
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.1)  # the pump is in the capture write now
        gone.set()
        await asyncio.sleep(0.1)
        publisher.gate.set()

    holder = asyncio.create_task(hold_the_capture())
    await raw_asgi.call(app, "POST", CHAT, body=json.dumps(BODIES[CHAT]).encode(), disconnect=gone,
                        on_body=got.append)
    await holder
    assert b"[DONE]" not in b"".join(got)
    assert isinstance(await _record(publisher), CallCaptured)
    await app.shutdown()


async def test_in_the_vllm_middleware_a_client_that_leaves_is_recorded_too(publisher):
    engine = StallingEngine(n_tokens=N_TOKENS, interval=0.005)
    settings = InterceptorSettings(upstream_url="http://in-process", bootstrap="unused:9092")
    app = TokentrailMiddleware(engine.asgi, settings=settings, publisher=publisher)
    await _leave_after(app, CHAT, events=3, how="disconnect")
    marker = await _record(publisher)
    assert marker.reason == "client_disconnected"
    await asyncio.wait_for(engine.closed.wait(), 1.0)  # the in-process request saw the disconnect
    assert engine.produced < N_TOKENS
    await app.interceptor.shutdown()


# -- not streamed: a harness that gave up on a slow engine (its own request timeout) ---------------

@pytest.mark.parametrize("mode", ["standalone", "middleware"])
async def test_a_client_that_leaves_while_the_engine_answers_is_recorded_not_captured(publisher, mode):
    engine = StallingEngine(stall="answer")
    if mode == "standalone":
        app = Interceptor(InterceptorSettings(upstream_url="http://engine", bootstrap="unused:9092"),
                          publisher=publisher, upstream=engine.client())  # type: ignore[arg-type]
        await app.startup()
        interceptor = app
    else:
        app = TokentrailMiddleware(engine.asgi, settings=InterceptorSettings(
            upstream_url="http://in-process", bootstrap="unused:9092"), publisher=publisher)
        interceptor = app.interceptor
    gone = asyncio.Event()

    async def give_up() -> None:
        while not engine.dispatched:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.1)
        gone.set()

    quitter = asyncio.create_task(give_up())
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    await asyncio.wait_for(raw_asgi.call(app, "POST", CHAT, body=json.dumps(body).encode(), disconnect=gone), 5)
    await quitter
    marker = await _record(publisher)
    assert marker.reason == "client_disconnected" and "not streamed" in marker.detail
    await asyncio.wait_for(engine.closed.wait(), 1.0)
    await interceptor.shutdown()
