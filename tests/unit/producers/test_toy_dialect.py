"""A dialect registered with one line is routed, captured with exact tokens, named by its
response ids and answered in its own error shape, through the real interceptor."""

from __future__ import annotations

import json

import httpx
import pytest

from producers.dialects.registry import DIALECTS, DialectRegistry
from producers.http.app import Interceptor
from producers.settings import InterceptorSettings
from schemas.ids import call_id_from_response_id
from schemas.records import CallCaptured, Dialect
from tests.unit.producers.fake_vllm import EOS, FakeVLLM
from tests.unit.producers.toy_dialect import TOY

TOY_DIALECTS = DialectRegistry([*DIALECTS, TOY])  # the one registration line
URL = "/ng-rollout/{rid}/training-token-capture/v1/toy/generate"


@pytest.fixture
async def toy(publisher):
    engine = FakeVLLM(served=("qwen-policy",))
    settings = InterceptorSettings(upstream_url="http://engine", bootstrap="unused:9092", control_token="s3cret")
    app = Interceptor(settings, publisher=publisher, upstream=engine.client(), dialects=TOY_DIALECTS)  # type: ignore[arg-type]
    await app.startup()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://tt") as http:
        yield http, engine
    await app.shutdown()


def captured(publisher) -> list[CallCaptured]:
    return [e.body for e in publisher.events if isinstance(e.body, CallCaptured)]


def expected_ids(engine: FakeVLLM, prompt: str, turn: int) -> tuple[list[int], list[int]]:
    """What the fake engine sampled: its template's prompt ids and its scripted generation."""
    prompt_ids = engine.render([{"role": "user", "content": prompt}])
    gen = [engine.vocab["<think>"], *engine.encode(f"step {turn}"), engine.vocab["</think>"],
           *engine.encode(f"answer {turn}"), EOS]
    return prompt_ids, gen


@pytest.mark.parametrize("stream", [False, True])
async def test_a_toy_call_is_captured_with_exact_tokens(toy, publisher, stream):
    http, engine = toy
    r = await http.post(URL.format(rid=f"toy-{stream}"), json={"model": "m", "prompt": "say hi", "stream": stream})
    assert r.status_code == 200, r.text
    if stream:
        events = [json.loads(line[5:]) for line in r.text.splitlines() if line.startswith("data:")]
        assert [e["delta"] for e in events[:-1]] == ["answer 1"]
        final = events[-1]
        assert final["done"] is True and final["finish"] == "stop"
    else:
        final = r.json()
        assert final["text"] == "answer 1" and final["finish"] == "stop"
    [call] = captured(publisher)
    prompt_ids, gen = expected_ids(engine, "say hi", 1)
    assert call.prompt_token_ids == prompt_ids and call.generation_token_ids == gen
    assert final["id"] == "toy-tt" + call.model_call_id
    assert call_id_from_response_id(final["id"]) == call.model_call_id
    assert call.facts.dialect is Dialect.UNKNOWN and call.facts.requested_model == "m"
    assert engine.bodies()[0]["messages"] == [{"role": "user", "content": "say hi"}]
    assert "token_ids" not in r.text and "prompt_token_ids" not in r.text


async def test_the_toy_routes_and_shapes_its_errors(toy, publisher):
    http, engine = toy
    assert TOY_DIALECTS.for_path("/v1/toy/generate/") is TOY
    assert TOY_DIALECTS.for_suffix("/ng-rollout/x/training-token-capture/v1/toy/generate") is TOY
    assert DIALECTS.for_path("/v1/toy/generate") is None  # the built-in table is untouched
    bad_body = await http.post(URL.format(rid="toy-bad"), json={"model": "m", "prompt": 7})
    assert bad_body.status_code == 400
    assert "'prompt' must be a string" in bad_body.json()["toy_error"]["message"]
    bad_id = await http.post(URL.format(rid="bad%09id"), json={"model": "m", "prompt": "x"})
    assert bad_id.status_code == 400 and "invalid rollout id" in bad_id.json()["toy_error"]["message"]
    assert captured(publisher) == [] and engine.bodies() == []

