"""vLLM's finish reasons (stop, length, abort, error, repetition) in every dialect, streaming and not:
each call leaves exactly one record, decided before anything is written (no orphan capture), and the
harness gets an answer its dialect can express or an error it can retry."""

from __future__ import annotations

import json

import httpx
import pytest

from schemas.records import CallCaptured, CallIncomplete
from tests.unit.producers.conftest import vllm_chat_response
from tests.unit.producers.fake_vllm import FakeVLLM

BASE = "/ng-rollout/{rid}/training-token-capture"
DIALECTS = {
    "chat": ("/v1/chat/completions", {"model": "x", "messages": [{"role": "user", "content": "hi"}]}),
    "anthropic": ("/v1/messages", {"model": "claude-x", "max_tokens": 100,
                                   "messages": [{"role": "user", "content": "hi"}]}),
    "responses": ("/v1/responses", {"model": "gpt-x", "input": "hi"}),
}
TERMINAL = {"chat": "data: [DONE]", "anthropic": "event: message_stop", "responses": "event: response.completed"}


async def _call(http, dialect: str, rid: str, stream: bool) -> httpx.Response:
    path, body = DIALECTS[dialect]
    return await http.post(BASE.format(rid=rid) + path, json={**body, "stream": stream})


def _only_event(publisher):
    (event,) = publisher.events  # exactly one record per call
    return event.body


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("dialect", list(DIALECTS))
async def test_an_aborted_generation_is_incomplete_and_retryable_never_captured(over_engine, publisher, dialect,
                                                                                stream):
    engine = FakeVLLM()
    engine.finish.append("abort")
    http, _ = await over_engine(engine)
    r = await _call(http, dialect, f"ab-{dialect}-{stream}", stream)
    marker = _only_event(publisher)
    assert isinstance(marker, CallIncomplete) and marker.reason == "aborted"
    if stream:
        assert TERMINAL[dialect] not in r.text and "error" in r.text and "aborted" in r.text
    else:
        assert r.status_code == 503 and r.headers["x-should-retry"] == "true"
        kind = r.json()["error"]["type"]
        assert kind == ("overloaded_error" if dialect == "anthropic" else "engine_aborted")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("dialect", list(DIALECTS))
async def test_a_repetition_stop_is_captured_and_ends_the_turn_in_each_dialect(over_engine, publisher, dialect,
                                                                               stream):
    engine = FakeVLLM()
    engine.finish.append("repetition")
    http, _ = await over_engine(engine)
    r = await _call(http, dialect, f"rep-{dialect}-{stream}", stream)
    assert r.status_code == 200, r.text
    call = _only_event(publisher)
    assert isinstance(call, CallCaptured) and call.finish_reason == "repetition"
    if stream:
        assert TERMINAL[dialect] in r.text
        expected = {"chat": '"finish_reason":"repetition"', "anthropic": '"stop_reason":"end_turn"',
                    "responses": '"status":"completed"'}[dialect]
        assert expected in r.text.replace(" ", "")
    else:
        got = {"chat": lambda b: b["choices"][0]["finish_reason"], "anthropic": lambda b: b["stop_reason"],
               "responses": lambda b: b["status"]}[dialect](r.json())
        assert got == {"chat": "repetition", "anthropic": "end_turn", "responses": "completed"}[dialect]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("dialect", list(DIALECTS))
async def test_an_error_finish_is_an_upstream_error_never_captured(over_engine, publisher, dialect, stream):
    engine = FakeVLLM()
    engine.finish.append("error")
    http, _ = await over_engine(engine)
    r = await _call(http, dialect, f"err-{dialect}-{stream}", stream)
    marker = _only_event(publisher)
    assert isinstance(marker, CallIncomplete) and marker.reason == "upstream_error"
    assert TERMINAL[dialect] not in r.text
    if not stream:
        assert r.status_code == 502


@pytest.mark.parametrize("stream", [False, True])
async def test_a_truncated_chat_generation_is_captured_with_its_finish_reason(over_engine, publisher, stream):
    http, _ = await over_engine(FakeVLLM())
    r = await http.post(BASE.format(rid="len") + "/v1/chat/completions",
                        json={"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                              "stream": stream})
    assert r.status_code == 200
    call = _only_event(publisher)
    assert call.finish_reason == "length" and len(call.generation_token_ids) == 3


async def test_a_stopped_call_records_stop(over_engine, publisher):
    http, _ = await over_engine(FakeVLLM())
    await _call(http, "chat", "stop", False)
    assert _only_event(publisher).finish_reason == "stop"


async def test_an_answer_the_dialect_cannot_express_is_incomplete_not_an_orphan_capture(interceptor, upstream,
                                                                                       publisher):
    # Anthropic tool_use.input must be an object; the engine's arguments are not JSON.
    calls = [{"id": "call_1", "type": "function", "function": {"name": "Bash", "arguments": "ls -la"}}]
    upstream.responses.append(httpx.Response(200, json=vllm_chat_response([1, 2], [3, 4], None, calls)))
    r = await interceptor.post(BASE.format(rid="untr") + "/v1/messages", json={
        "model": "claude-x", "max_tokens": 50, "messages": [{"role": "user", "content": "list"}],
        "tools": [{"name": "Bash", "input_schema": {"type": "object"}}]})
    assert r.status_code == 502 and "cannot be expressed" in r.json()["error"]["message"]
    marker = _only_event(publisher)
    assert isinstance(marker, CallIncomplete) and marker.reason == "untranslatable_output"
    assert "not valid JSON" in marker.detail


async def test_a_stream_the_dialect_cannot_express_is_incomplete(interceptor, upstream, publisher):
    # A tool-call delta without an id cannot open an Anthropic tool_use block.
    chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}], "prompt_token_ids": [1]},
              {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]},
                            "token_ids": [5], "logprobs": {"content": [{"logprob": -0.5}]}}]},
              {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls", "token_ids": [6],
                            "logprobs": {"content": [{"logprob": -0.5}]}}]}]
    sse = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    upstream.responses.append(httpx.Response(200, content=sse, headers={"content-type": "text/event-stream"}))
    r = await interceptor.post(BASE.format(rid="untr-s") + "/v1/messages", json={
        "model": "claude-x", "max_tokens": 50, "stream": True, "messages": [{"role": "user", "content": "list"}]})
    assert "event: error" in r.text and "message_stop" not in r.text
    marker = _only_event(publisher)
    assert isinstance(marker, CallIncomplete) and marker.reason == "untranslatable_output"
