"""Whatever the upstream raises (in middleware mode the in-process engine raises anything, e.g.
KeyError), the harness gets a clean error and the rollout gets evidence; log-probs that are not the
policy's (vLLM's -9999.0 placeholder, non-finite values) make the capture partial; the operator's
declared --logprobs-mode is validated and recorded."""

from __future__ import annotations

import argparse
import json
import re

import httpx
import pytest
from pydantic import ValidationError

from producers import cli
from producers.engine.extract import PartialTokenMetadata, extract_chat_tokens
from producers.settings import InterceptorSettings
from schemas.records import CallCaptured, CallIncomplete
from tests.unit.producers.conftest import vllm_chat_response
from tests.unit.producers.fake_vllm import FakeVLLM

CHAT = "/ng-rollout/{rid}/training-token-capture/v1/chat/completions"
MESSAGES = "/ng-rollout/{rid}/training-token-capture/v1/messages"
HELLO = [{"role": "user", "content": "hello"}]


def only(publisher):
    (event,) = publisher.events
    return event.body


@pytest.mark.parametrize("stream", [False, True])
async def test_an_arbitrary_exception_from_the_upstream_is_an_upstream_error(over_engine, publisher, stream):
    engine = FakeVLLM()
    engine.raise_on["/v1/chat/completions"] = KeyError("app")
    http, _ = await over_engine(engine)
    r = await http.post(CHAT.format(rid="ke"), json={"model": "x", "messages": HELLO, "stream": stream})
    assert r.status_code == 502 and "KeyError" in r.json()["error"]["message"]
    marker = only(publisher)
    assert isinstance(marker, CallIncomplete) and marker.reason == "upstream_error" and "KeyError" in marker.detail
    r = await http.post(MESSAGES.format(rid="ke"), json={"model": "c", "max_tokens": 9, "stream": stream,
                                                         "messages": HELLO})
    assert r.status_code == 502 and r.json()["type"] == "error"


async def test_a_stream_that_raises_midway_is_interrupted_with_an_error_event(interceptor, upstream, publisher):
    class Breaking(httpx.AsyncByteStream):
        async def __aiter__(self):
            first = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}], "prompt_token_ids": [1]}
            yield b"data: " + json.dumps(first).encode() + b"\n\n"
            raise KeyError("app")

    upstream.responses.append(httpx.Response(200, stream=Breaking(), headers={"content-type": "text/event-stream"}))
    r = await interceptor.post(CHAT.format(rid="brk"), json={"model": "x", "messages": HELLO, "stream": True})
    assert "[DONE]" not in r.text and '"error"' in r.text
    marker = only(publisher)
    assert marker.reason == "stream_interrupted" and "KeyError" in marker.detail


async def test_an_engine_error_event_mid_stream_is_an_upstream_error(interceptor, upstream, publisher):
    sse = (b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}],"prompt_token_ids":[1]}\n\n'
           b'data: {"error":{"message":"KV load failed","type":"InternalServerError","code":500}}\n\n'
           b"data: [DONE]\n\n")
    upstream.responses.append(httpx.Response(200, content=sse, headers={"content-type": "text/event-stream"}))
    r = await interceptor.post(CHAT.format(rid="evt"), json={"model": "x", "messages": HELLO, "stream": True})
    assert "[DONE]" not in r.text
    marker = only(publisher)
    assert marker.reason == "upstream_error" and "KV load failed" in marker.detail


async def test_a_discovery_that_raises_does_not_stop_the_call(over_engine, publisher):
    engine = FakeVLLM(served=("x",))
    engine.raise_on["/v1/models"] = KeyError("app")
    http, _ = await over_engine(engine)
    r = await http.post(CHAT.format(rid="disc"), json={"model": "x", "messages": HELLO})
    assert r.status_code == 200 and isinstance(only(publisher), CallCaptured)


async def test_a_failure_inside_capture_is_recorded_and_named_not_a_bare_500(over_engine, publisher, monkeypatch):
    http, app = await over_engine(FakeVLLM())

    async def broken(*args, **kwargs):
        raise RuntimeError("bug in capture")

    monkeypatch.setattr(app.core, "complete", broken)
    r = await http.post(CHAT.format(rid="bug"), json={"model": "x", "messages": HELLO})
    assert r.status_code == 500 and "bug in capture" in r.json()["error"]["message"]
    marker = only(publisher)
    assert marker.reason == "capture_exception" and "bug in capture" in marker.detail


async def test_a_forwarded_request_whose_upstream_raises_is_a_502(over_engine, publisher):
    engine = FakeVLLM()
    engine.raise_on["/v1/models"] = KeyError("app")
    http, _ = await over_engine(engine)
    r = await http.get("/v1/models")
    assert r.status_code == 502 and publisher.events == []


@pytest.mark.parametrize("stream", [False, True])
async def test_vllms_placeholder_logprob_makes_the_capture_partial(over_engine, publisher, stream):
    engine = FakeVLLM()
    engine.logprobs = [-0.5, -9999.0]
    http, _ = await over_engine(engine)
    r = await http.post(CHAT.format(rid="lp"), json={"model": "x", "messages": HELLO, "stream": stream})
    assert r.status_code == 200  # the answer still goes back; the tokens cannot be trained on
    marker = only(publisher)
    assert marker.reason == "partial_token_metadata" and "-9999.0" in marker.detail and "token 1" in marker.detail


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), -1e6])
def test_non_finite_or_floored_logprobs_are_partial(value):
    data = vllm_chat_response([1], [2, 3])
    data["choices"][0]["logprobs"]["content"][1]["logprob"] = value
    with pytest.raises(PartialTokenMetadata, match="generated token 1"):
        extract_chat_tokens(data)


@pytest.mark.parametrize(("field", "value", "named"), [
    ("token_ids", 5, "choices[0].token_ids must be a list, got a JSON number"),
    ("token_ids", "ab", "choices[0].token_ids must be a list, got a JSON string"),
    ("content", 5, "choices[0].logprobs.content must be a list, got a JSON number"),
    ("content", {"logprob": -0.5}, "choices[0].logprobs.content must be a list, got a JSON object"),
])
def test_a_token_field_that_is_not_a_list_is_partial_metadata_naming_it(field, value, named):
    # A number has no length: it once escaped as a TypeError (a 500 capture_exception, the answer lost to
    # the harness) where the answer should go back with the capture marked partial.
    data = vllm_chat_response([1], [2, 3])
    (data["choices"][0] if field == "token_ids" else data["choices"][0]["logprobs"])[field] = value
    with pytest.raises(PartialTokenMetadata, match=re.escape(named)):
        extract_chat_tokens(data)


def test_real_logprobs_pass_bit_exact():
    data = vllm_chat_response([1], [2, 3])
    data["choices"][0]["logprobs"]["content"][0]["logprob"] = -9998.999999
    assert extract_chat_tokens(data).generation_log_probs == [-9998.999999, -0.5]


async def test_the_declared_logprobs_mode_is_recorded_on_each_call(over_engine, publisher):
    http, _ = await over_engine(FakeVLLM(), logprobs_mode="processed_logprobs")
    await http.post(CHAT.format(rid="mode"), json={"model": "x", "messages": HELLO})
    assert only(publisher).facts.logprobs_mode == "processed_logprobs"


@pytest.mark.parametrize("mode", ["raw_logits", "processed_logits"])
def test_logit_modes_are_refused_naming_the_vllm_flag(mode):
    with pytest.raises(ValidationError, match=r"logits, not log-probabilities.*--logprobs-mode raw_logprobs"):
        InterceptorSettings(upstream_url="http://e", bootstrap="k:9092", logprobs_mode=mode)


def test_an_unknown_logprobs_mode_lists_the_allowed_ones():
    with pytest.raises(ValidationError, match="allowed: raw_logprobs, processed_logprobs"):
        InterceptorSettings(upstream_url="http://e", bootstrap="k:9092", logprobs_mode="logprobs")


def test_the_cli_refuses_a_logit_mode_and_reads_the_engine_key_from_the_environment(monkeypatch, capsys):
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    args = parser.parse_args(["--upstream", "http://e", "--bootstrap", "k:9092", "--logprobs-mode", "raw_logits"])
    assert cli.main(args) == 2 and "--logprobs-mode raw_logprobs" in capsys.readouterr().err
    seen = {}
    monkeypatch.setenv("TOKENTRAIL_UPSTREAM_API_KEY", "k-engine")
    monkeypatch.setattr("uvicorn.run", lambda app, **kw: seen.setdefault("settings", app.settings))
    # main() tunes the process (logging, gc) for serving: keep the test process as it is.
    monkeypatch.setattr("producers.logs.configure_logging", lambda *a, **k: None)
    monkeypatch.setattr("gc.freeze", lambda: None)
    monkeypatch.setattr("gc.set_threshold", lambda *a: None)
    args = parser.parse_args(["--upstream", "http://e", "--bootstrap", "k:9092"])
    assert cli.main(args) == 0
    settings = seen["settings"]
    assert settings.upstream_api_key.get_secret_value() == "k-engine" and "k-engine" not in repr(settings)
    assert settings.logprobs_mode == "raw_logprobs"


async def test_an_answer_whose_token_ids_are_a_number_still_reaches_the_harness(interceptor, upstream, publisher):
    body = vllm_chat_response([1, 2], [3, 4])
    body["choices"][0]["token_ids"] = 5
    upstream.responses.append(httpx.Response(200, json=body))
    r = await interceptor.post(CHAT.format(rid="not-a-list"), json={"model": "policy", "messages": HELLO})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "hi"
    marker = only(publisher)
    assert marker.reason == "partial_token_metadata" and "choices[0].token_ids must be a list" in marker.detail
