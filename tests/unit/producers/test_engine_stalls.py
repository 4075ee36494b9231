"""A stalled engine never hangs the harness: within ``engine_timeout_s`` (the whole call) or
``stream_idle_timeout_s`` (a stream's silence, before its first chunk too) the harness gets a 504 or an
error event in its dialect, the call records CallIncomplete(engine_timeout) naming the timeout, and the
engine request is closed. Every captured call's CallStarted intent is produced before the engine sees it and
is durable before the harness sees anything, so a rollout finished meanwhile is masked; without a durable
intent the call is a 503 and nothing is served or recorded."""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import httpx
import pytest
from pydantic import ValidationError

from producers import cli
from producers.middleware import TokentrailMiddleware
from producers.middleware_env import settings_from_env
from producers.settings import InterceptorSettings
from schemas.errors import ConfigError
from schemas.records import CallCaptured, CallIncomplete, CallStarted
from tests.unit.producers.stalling_engine import StallingEngine

CHAT = "/ng-rollout/{rid}/training-token-capture/v1/chat/completions"
MESSAGES = "/ng-rollout/{rid}/training-token-capture/v1/messages"
HELLO = [{"role": "user", "content": "hello"}]
PROMPT = 3.0  # every timeout below is well under a second: the harness hears back long before this


def _request(dialect: str, rid: str, stream: bool) -> tuple[str, dict]:
    if dialect == "chat":
        return CHAT.format(rid=rid), {"model": "m", "messages": HELLO, "stream": stream}
    return MESSAGES.format(rid=rid), {"model": "claude", "max_tokens": 50, "messages": HELLO, "stream": stream}


def _intent_then(publisher) -> CallIncomplete | CallCaptured:
    """The call's record, after checking its intent came first, for the same call."""
    intent, record = (e.body for e in publisher.all)
    assert isinstance(intent, CallStarted) and intent.model_call_id == record.model_call_id
    return record


@pytest.mark.parametrize("dialect", ["chat", "anthropic"])
async def test_an_engine_that_never_answers_is_a_504_within_engine_timeout_s(over_engine, publisher, dialect):
    engine = StallingEngine(stall="answer")
    http, _ = await over_engine(engine, engine_timeout_s=0.3)
    path, body = _request(dialect, "stall-1", stream=False)
    t0 = time.monotonic()
    r = await http.post(path, json=body)
    assert r.status_code == 504 and time.monotonic() - t0 < PROMPT
    assert "engine_timeout_s=0.3" in r.text and "--engine-timeout-s" in r.text
    marker = _intent_then(publisher)
    assert isinstance(marker, CallIncomplete) and marker.reason == "engine_timeout"
    assert "engine_timeout_s=0.3s" in marker.detail
    assert engine.closed.is_set(), "the engine request was left running"


@pytest.mark.parametrize("dialect", ["chat", "anthropic"])
@pytest.mark.parametrize("stall", [0, 2], ids=["before-first-chunk", "mid-stream"])
async def test_a_silent_stream_ends_with_an_error_event_within_stream_idle_timeout_s(over_engine, publisher,
                                                                                    dialect, stall):
    engine = StallingEngine(stall=stall, n_tokens=5)
    http, _ = await over_engine(engine, stream_idle_timeout_s=0.3)
    path, body = _request(dialect, "stall-2", stream=True)
    t0 = time.monotonic()
    r = await http.post(path, json=body)
    assert r.status_code == 200 and time.monotonic() - t0 < PROMPT
    assert "[DONE]" not in r.text and "message_stop" not in r.text
    assert "error" in r.text and "stream_idle_timeout_s=0.3" in r.text
    marker = _intent_then(publisher)
    assert marker.reason == "engine_timeout" and f"after {stall} chunks" in marker.detail
    assert "--stream-idle-timeout-s" in marker.detail
    assert engine.closed.is_set() and engine.produced == max(stall - 1, 0)


async def test_an_engine_that_does_not_even_list_its_models_still_times_out(over_engine, publisher):
    engine = StallingEngine(stall="everything")
    http, _ = await over_engine(engine, engine_timeout_s=0.3, stream_idle_timeout_s=0.3)
    t0 = time.monotonic()
    r = await http.post(CHAT.format(rid="stall-all"), json={"model": "m", "messages": HELLO})
    assert r.status_code == 504 and time.monotonic() - t0 < PROMPT
    assert _intent_then(publisher).reason == "engine_timeout"


async def test_a_stream_whose_answer_never_starts_is_a_504(over_engine, publisher):
    engine = StallingEngine(stall="answer")
    http, _ = await over_engine(engine, stream_idle_timeout_s=0.3)
    path, body = _request("chat", "stall-3", stream=True)
    r = await http.post(path, json=body)
    assert r.status_code == 504 and "stream_idle_timeout_s=0.3" in r.text
    assert _intent_then(publisher).reason == "engine_timeout" and engine.closed.is_set()


async def test_a_stream_that_trickles_on_is_cut_at_engine_timeout_s(over_engine, publisher):
    engine = StallingEngine(n_tokens=10_000, interval=0.02)
    http, _ = await over_engine(engine, engine_timeout_s=0.4, stream_idle_timeout_s=5)
    path, body = _request("chat", "stall-4", stream=True)
    t0 = time.monotonic()
    r = await http.post(path, json=body)
    assert time.monotonic() - t0 < PROMPT and "[DONE]" not in r.text and "engine_timeout_s=0.4" in r.text
    marker = _intent_then(publisher)
    assert marker.reason == "engine_timeout" and "engine_timeout_s=0.4s" in marker.detail
    assert engine.closed.is_set() and 0 < engine.produced < 10_000


async def test_a_slow_stream_within_its_timeouts_is_captured(over_engine, publisher):
    # The silence bound is between chunks, not over the whole stream.
    engine = StallingEngine(n_tokens=6, interval=0.1)
    http, _ = await over_engine(engine, stream_idle_timeout_s=0.35)
    path, body = _request("chat", "slow", stream=True)
    r = await http.post(path, json=body)
    assert r.text.endswith("data: [DONE]\n\n")
    assert isinstance(_intent_then(publisher), CallCaptured)


async def _drive(app, path: str, body: dict, sent: list[dict]) -> None:
    """One request through the raw ASGI app; every message the app sends is appended to ``sent`` as it goes."""
    data = json.dumps(body).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "server": ("tt", 80),
             "client": ("127.0.0.1", 5000), "headers": [(b"host", b"tt"), (b"content-type", b"application/json")]}
    delivered = False

    async def receive() -> dict:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": data, "more_body": False}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    await app(scope, receive, send)


@pytest.mark.parametrize("stream", [False, True])
async def test_the_engine_works_while_the_intent_is_acked_and_the_harness_waits_for_it(over_engine, publisher,
                                                                                       stream):
    engine = StallingEngine()
    _, app = await over_engine(engine)
    publisher.gate = asyncio.Event()  # hold every ack: the intent is produced, not yet durable
    sent: list[dict] = []
    path, body = _request("chat", "intent-1", stream)
    task = asyncio.create_task(_drive(app, path, body, sent))
    for _ in range(100):
        if engine.dispatched:
            break
        await asyncio.sleep(0.01)
    assert engine.dispatched == 1, "the engine waited for the intent's ack (one ack too many on the critical path)"
    await asyncio.sleep(0.2)
    assert sent == [], "the harness was answered before the call's intent was durable"
    publisher.gate.set()
    await task
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    assert isinstance(_intent_then(publisher), CallCaptured)  # the intent is first on the log
    assert publisher.intents[0].body.route == "/v1/chat/completions"


@pytest.mark.parametrize("stream", [False, True])
async def test_without_a_durable_intent_nothing_is_served_or_recorded(over_engine, publisher, stream):
    engine = StallingEngine(n_tokens=50, interval=0.01)
    http, _ = await over_engine(engine)
    publisher.fail = True
    r = await http.post(CHAT.format(rid="intent-2"), json={"model": "m", "messages": HELLO, "stream": stream})
    assert r.status_code == 503 and "durable" in r.json()["error"]["message"]
    assert publisher.all == [] and "data:" not in r.text
    if stream:  # the engine's stream was closed at once, not read to its end
        await asyncio.wait_for(engine.closed.wait(), 1.0)
        assert engine.produced < 50


# -- the vLLM middleware: httpx's timeouts do not reach an in-process engine ---------------------

@pytest.mark.parametrize("stream", [False, True])
async def test_a_stalled_in_process_engine_is_abandoned_within_the_timeouts(publisher, stream):
    engine = StallingEngine(stall="answer" if not stream else 1, n_tokens=5)
    settings = InterceptorSettings(upstream_url="http://in-process", bootstrap="unused:9092", engine_timeout_s=0.3,
                                   stream_idle_timeout_s=0.3)
    app = TokentrailMiddleware(engine.asgi, settings=settings, publisher=publisher)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://vllm") as http:
        t0 = time.monotonic()
        r = await http.post(CHAT.format(rid="mw-stall"), json={"model": "m", "messages": HELLO, "stream": stream})
        assert time.monotonic() - t0 < PROMPT
    assert (r.status_code == 504) if not stream else ("[DONE]" not in r.text and "timeout_s=0.3" in r.text)
    assert _intent_then(publisher).reason == "engine_timeout"
    await asyncio.wait_for(engine.closed.wait(), 1.0)  # it saw the disconnect (vLLM aborts the request)
    await app.interceptor.shutdown()


async def test_an_in_process_engine_that_ignores_the_disconnect_is_cancelled(publisher, monkeypatch):
    monkeypatch.setattr("producers.http.inprocess._ABANDON_GRACE_S", 0.1)
    engine = StallingEngine(stall="answer")
    engine.ignore_disconnect = True
    settings = InterceptorSettings(upstream_url="http://in-process", bootstrap="unused:9092", engine_timeout_s=0.3)
    app = TokentrailMiddleware(engine.asgi, settings=settings, publisher=publisher)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://vllm") as http:
        r = await http.post(CHAT.format(rid="mw-deaf"), json={"model": "m", "messages": HELLO})
    assert r.status_code == 504
    await asyncio.wait_for(engine.closed.wait(), 1.0)
    await app.interceptor.shutdown()


# -- settings: one home, validated, on the CLI and in the middleware's environment ---------------

@pytest.mark.parametrize("field", ["engine_timeout_s", "stream_idle_timeout_s"])
@pytest.mark.parametrize("value", [0, -1, float("inf"), float("nan")])
def test_timeouts_must_be_positive_seconds(field, value):
    with pytest.raises(ValidationError, match=f"{field}=.* must be a positive, finite number of seconds"):
        InterceptorSettings(upstream_url="http://e", bootstrap="k:9092", **{field: value})


def test_the_defaults_survive_a_long_generation_and_a_long_prefill():
    s = InterceptorSettings(upstream_url="http://e", bootstrap="k:9092")
    assert s.engine_timeout_s == 1800 and s.stream_idle_timeout_s == 300
    assert "upstream_timeout_s" not in InterceptorSettings.model_fields  # one home: the two above


def test_the_timeouts_come_from_cli_flags_and_environment_variables(monkeypatch, capsys):
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    seen = {}
    monkeypatch.setattr("uvicorn.run", lambda app, **kw: seen.setdefault("settings", app.settings))
    monkeypatch.setattr("producers.logs.configure_logging", lambda *a, **k: None)
    monkeypatch.setattr("gc.freeze", lambda: None)
    monkeypatch.setattr("gc.set_threshold", lambda *a: None)
    args = parser.parse_args(["--upstream", "http://e", "--bootstrap", "k:9092", "--engine-timeout-s", "90",
                              "--stream-idle-timeout-s", "45"])
    assert cli.main(args) == 0
    assert (seen["settings"].engine_timeout_s, seen["settings"].stream_idle_timeout_s) == (90, 45)
    bad = parser.parse_args(["--upstream", "http://e", "--bootstrap", "k:9092", "--stream-idle-timeout-s", "0"])
    assert cli.main(bad) == 2 and "stream_idle_timeout_s=0.0 must be a positive" in capsys.readouterr().err
    env = {"TOKENTRAIL_BOOTSTRAP": "k:9092", "TOKENTRAIL_ENGINE_TIMEOUT_S": "120",
           "TOKENTRAIL_STREAM_IDLE_TIMEOUT_S": "30"}
    s = settings_from_env(env)
    assert (s.engine_timeout_s, s.stream_idle_timeout_s) == (120, 30)
    with pytest.raises(ConfigError, match="TOKENTRAIL_ENGINE_TIMEOUT_S"):
        settings_from_env({**env, "TOKENTRAIL_ENGINE_TIMEOUT_S": "soon"})
    with pytest.raises(ConfigError, match="TOKENTRAIL_STREAM_IDLE_TIMEOUT_S"):
        settings_from_env({**env, "TOKENTRAIL_STREAM_IDLE_TIMEOUT_S": "-5"})


def test_an_error_event_names_the_timeout_in_json():
    # The chat dialect's error event is JSON the OpenAI SDK raises from (APIError with the message).
    from producers.dialects.chat import ChatStreamAdapter

    event = ChatStreamAdapter("chatcmpl-x", keep_logprobs=False).error(504, "engine_timeout_s=1", "engine_timeout")
    assert json.loads(event[6:])["error"]["type"] == "engine_timeout"
