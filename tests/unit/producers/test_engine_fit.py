"""Fitting a harness's request to the engine it is sent to (a FakeVLLM with vLLM's routes and texts):
model names the engine serves, max_tokens within max_model_len, credentials vLLM accepts, weight
versions it names, and the evidence left when the engine refuses anyway."""

from __future__ import annotations

import asyncio
import json

import pytest

from consumers.rebuild.rules import RebuildRules
from consumers.replay.eventlog import LoggedEvent
from consumers.replay.rollouts import fold_records
from schemas.codec import encode_event
from schemas.records import CallCaptured, CallIncomplete, RolloutFinished
from tests.factories import event
from tests.unit.producers.fake_vllm import FakeVLLM

CHAT = "/ng-rollout/{rid}/training-token-capture/v1/chat/completions"
MESSAGES = "/ng-rollout/{rid}/training-token-capture/v1/messages"
HELLO = [{"role": "user", "content": "hello there"}]


def captured(publisher) -> list[CallCaptured]:
    return [e.body for e in publisher.events if isinstance(e.body, CallCaptured)]


def markers(publisher) -> list[CallIncomplete]:
    return [e.body for e in publisher.events if isinstance(e.body, CallIncomplete)]


async def test_a_model_the_engine_does_not_serve_is_replaced_and_the_asked_name_kept(over_engine, publisher):
    engine = FakeVLLM(served=("qwen-policy",))
    http, _ = await over_engine(engine)
    for _ in range(2):
        r = await http.post(CHAT.format(rid="m-1"), json={"model": "claude-sonnet-4", "messages": HELLO})
        assert r.status_code == 200, r.text
    assert [b["model"] for b in engine.bodies()] == ["qwen-policy", "qwen-policy"]
    assert engine.paths().count("/v1/models") == 1  # asked once, then cached
    facts = captured(publisher)[0].facts
    assert facts.requested_model == "claude-sonnet-4" and facts.served_model == "qwen-policy"


async def test_a_served_name_is_kept_and_an_unserved_one_gets_the_first_served(over_engine):
    engine = FakeVLLM(served=("base", "lora-a"))
    http, _ = await over_engine(engine)
    await http.post(CHAT.format(rid="m-2"), json={"model": "lora-a", "messages": HELLO})
    await http.post(CHAT.format(rid="m-2"), json={"model": "gpt-5", "messages": HELLO})
    assert [b["model"] for b in engine.bodies()] == ["lora-a", "base"]


async def test_upstream_model_forces_the_name(over_engine):
    engine = FakeVLLM(served=("base", "lora-a"))
    http, _ = await over_engine(engine, upstream_model="lora-a")
    await http.post(CHAT.format(rid="m-3"), json={"model": "base", "messages": HELLO})
    assert engine.bodies()[0]["model"] == "lora-a"


async def test_a_failed_discovery_is_retried_by_the_next_call(over_engine, publisher):
    engine = FakeVLLM(served=("qwen-policy",))
    engine.models_status = 503
    http, _ = await over_engine(engine)
    r = await http.post(CHAT.format(rid="m-4"), json={"model": "claude-x", "messages": HELLO})
    assert r.status_code == 404  # sent as asked; the engine's refusal reaches the harness
    (marker,) = markers(publisher)
    assert marker.reason == "engine_rejected" and marker.http_status == 404
    assert "does not exist" in marker.detail
    engine.models_status = 200
    r = await http.post(CHAT.format(rid="m-4"), json={"model": "claude-x", "messages": HELLO})
    assert r.status_code == 200 and engine.paths().count("/v1/models") == 2


async def test_concurrent_first_calls_share_one_discovery(over_engine):
    engine = FakeVLLM()
    http, _ = await over_engine(engine)
    answers = await asyncio.gather(*(http.post(CHAT.format(rid=f"m-5-{i}"), json={"model": "x", "messages": HELLO})
                                     for i in range(6)))
    assert [a.status_code for a in answers] == [200] * 6
    assert engine.paths().count("/v1/models") == 1


async def test_max_tokens_above_max_model_len_is_clamped_without_a_round_trip(over_engine, publisher):
    engine = FakeVLLM(max_model_len=4096)  # vLLM 0.32: refuses max_tokens > max_model_len, caps the rest itself
    http, _ = await over_engine(engine)
    r = await http.post(CHAT.format(rid="mt-1"), json={"model": "x", "messages": HELLO, "max_tokens": 128000})
    assert r.status_code == 200, r.text
    (sent,) = engine.bodies()
    assert sent["max_tokens"] == 4096
    facts = captured(publisher)[0].facts
    assert facts.max_tokens == 128000 and facts.max_tokens_sent == 4096 and facts.max_tokens_clamped
    assert json.loads(facts.sampling_json)["max_tokens"] == 4096  # what was actually sent


async def test_a_budget_that_fits_is_sent_unchanged(over_engine, publisher):
    engine = FakeVLLM(max_model_len=4096)
    http, _ = await over_engine(engine)
    await http.post(CHAT.format(rid="mt-2"), json={"model": "x", "messages": HELLO, "max_completion_tokens": 300})
    assert engine.bodies()[0]["max_completion_tokens"] == 300
    facts = captured(publisher)[0].facts
    assert facts.max_tokens_sent == 300 and not facts.max_tokens_clamped


@pytest.mark.parametrize("style", ["requested", "opaque"])
async def test_a_context_refusal_is_retried_once_with_what_the_window_leaves(over_engine, publisher, style):
    # "requested": the text names the prompt length; "opaque": it does not, so /tokenize measures it.
    engine = FakeVLLM(max_model_len=64, context_style=style)
    http, _ = await over_engine(engine)
    r = await http.post(CHAT.format(rid=f"mt-3-{style}"), json={"model": "x", "messages": HELLO, "max_tokens": 60})
    assert r.status_code == 200, r.text
    prompt_len = len(engine.render(HELLO))
    assert [b["max_tokens"] for b in engine.bodies()] == [60, 64 - prompt_len]
    assert ("/tokenize" in engine.paths()) is (style == "opaque")
    (call,) = captured(publisher)
    assert call.facts.max_tokens_sent == 64 - prompt_len and call.facts.max_tokens_clamped
    assert markers(publisher) == []  # the retry succeeded: nothing was lost


async def test_a_prompt_longer_than_the_window_is_refused_and_recorded_with_the_engines_words(over_engine, publisher):
    engine = FakeVLLM(max_model_len=8)
    http, _ = await over_engine(engine)
    long = [{"role": "user", "content": "one two three four five six seven eight nine"}]
    r = await http.post(CHAT.format(rid="mt-4"), json={"model": "x", "messages": long, "max_tokens": 4})
    assert r.status_code == 400 and "maximum context length" in r.json()["error"]["message"]
    assert len(engine.bodies()) == 1  # no room left: not retried
    (marker,) = markers(publisher)
    assert marker.reason == "engine_rejected" and marker.http_status == 400
    assert marker.detail.startswith("This model's maximum context length is 8 tokens")


async def test_claude_codes_max_tokens_is_served_through_the_anthropic_dialect(over_engine, publisher):
    engine = FakeVLLM(max_model_len=4096, context_style="requested")
    http, _ = await over_engine(engine)
    r = await http.post(MESSAGES.format(rid="mt-5"), json={"model": "claude-opus-4-1", "max_tokens": 32000,
                                                           "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    assert r.json()["stop_reason"] == "end_turn"
    assert [b["max_tokens"] for b in engine.bodies()] == [4096, 4096 - len(engine.render([{"role": "user",
                                                                                            "content": "hi"}]))]
    assert captured(publisher)[0].facts.max_tokens == 32000


async def test_the_mask_reason_of_a_refused_call_quotes_the_engine(over_engine, publisher):
    engine = FakeVLLM(max_model_len=20)
    http, _ = await over_engine(engine)
    assert (await http.post(CHAT.format(rid="mask-1"), json={"model": "x", "messages": HELLO})).status_code == 200
    long = [{"role": "user", "content": " ".join(["word"] * 30)}]
    assert (await http.post(CHAT.format(rid="mask-1"), json={"model": "x", "messages": long})).status_code == 400
    values = [raw for _, _, raw in publisher.raw] + [encode_event(event("mask-1", RolloutFinished()))]
    records = [LoggedEvent(0, i, i, v) for i, v in enumerate(values)]
    out = fold_records("mask-1", records, RebuildRules())
    (reason,) = [m for m in out.rollout.mask_reasons if m.code == "capture_incomplete"]
    assert reason.detail.startswith("engine_rejected (HTTP 400: This model's maximum context length is 20 tokens")


async def test_a_harness_x_api_key_is_not_mapped_to_the_engine(over_engine):
    # Was: an Anthropic x-api-key went to the engine as Bearer. Issue 15 item 12: headers towards the engine
    # come from an allow-list; an engine with --api-key needs TOKENTRAIL_UPSTREAM_API_KEY (next test).
    engine = FakeVLLM(api_key="k-engine")
    http, _ = await over_engine(engine)
    r = await http.post(MESSAGES.format(rid="auth-1"), headers={"x-api-key": "k-engine"},
                        json={"model": "claude-x", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 401, r.text  # the engine's refusal: the harness's key never reached it
    assert all("authorization" not in req["headers"] and "x-api-key" not in req["headers"] for req in engine.requests)


async def test_upstream_api_key_replaces_the_harness_credential(over_engine):
    engine = FakeVLLM(api_key="k-engine")
    http, _ = await over_engine(engine, upstream_api_key="k-engine")
    r = await http.post(MESSAGES.format(rid="auth-2"), headers={"x-api-key": "sk-ant-harness"},
                        json={"model": "claude-x", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    r = await http.post(CHAT.format(rid="auth-2"), headers={"authorization": "Bearer sk-openai-harness"},
                        json={"model": "x", "messages": HELLO})
    assert r.status_code == 200, r.text
    assert all(req["headers"]["authorization"] == "Bearer k-engine" for req in engine.requests)
    assert all("x-api-key" not in req["headers"] for req in engine.requests)  # never forwarded


@pytest.mark.parametrize(("label", "admin", "expected"), [
    ("default", None, (None, "")),  # vLLM's label of unnamed weights is no version
    ("default", "step-9", ("step-9", "admin")),
    ("v7", "step-9", ("v7", "engine")),
])
async def test_vllms_default_weight_label_is_no_version(over_engine, publisher, label, admin, expected):
    engine = FakeVLLM(weight_version=label)
    http, app = await over_engine(engine)
    app.core.clock.set_admin(admin)
    await http.post(CHAT.format(rid="wv"), json={"model": "x", "messages": HELLO})
    facts = captured(publisher)[0].facts
    assert (facts.policy_version, facts.policy_version_source) == expected


async def test_a_server_without_a_model_list_is_asked_once_and_sent_names_as_asked(over_engine, publisher):
    engine = FakeVLLM(served=("x",))
    engine.models_status = 404
    http, _ = await over_engine(engine)
    for _ in range(2):
        assert (await http.post(CHAT.format(rid="m-6"), json={"model": "x", "messages": HELLO})).status_code == 200
    assert engine.paths().count("/v1/models") == 1 and [b["model"] for b in engine.bodies()] == ["x", "x"]
