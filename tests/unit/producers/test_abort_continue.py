"""A generation the engine aborts for a weight update, under each abort policy (stand-in engine in process).

``continue``: the harness gets one answer; the capture is one call whose tokens are the engine's
own, across both weight versions, token-exact (each generated token's log-prob is the score of
that token under the version its span names). ``mask``: CallIncomplete(aborted), a retryable 503,
and the retry names the aborted call (``retry_of``).
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from producers.dialects import anthropic
from schemas.records import CallCaptured, CallIncomplete

CHAT = "/ng-rollout/{rid}/training-token-capture/v1/chat/completions"
ADMIN = {"authorization": "Bearer s3cret"}


@pytest.fixture
def rig(policy_rig):
    return policy_rig  # tests/unit/producers/conftest.py


async def _weight_sync(http: httpx.AsyncClient, engine: httpx.AsyncClient, label: str) -> None:
    """What a trainer does: pause (abort), name the new weights, announce them, resume."""
    assert (await engine.post("/pause", params={"mode": "abort"})).status_code == 200
    await asyncio.sleep(0.05)  # the weights take a while: the abort reaches the interceptor meanwhile
    assert (await engine.post("/update_weight_version", json={"new_version": label})).status_code == 200
    assert (await http.post("/tokentrail/admin/policy-version", json={"version": label}, headers=ADMIN)).status_code == 200
    assert (await engine.post("/resume")).status_code == 200


def _body(stream: bool) -> dict:
    return {"model": "tokentrail-policy", "messages": [{"role": "user", "content": "go"}], "max_tokens": 400,
            "ignore_eos": True, "stream": stream, "temperature": 1.0}


async def _token_exact(engine: httpx.AsyncClient, call: CallCaptured) -> None:
    ids = call.prompt_token_ids + call.generation_token_ids
    start = len(call.prompt_token_ids)
    for s in call.facts.version_spans:
        assert s.version, call.facts.version_spans
        r = await engine.post("/tokentrail/score", json={"token_ids": ids, "start": start, "weight_version": s.version})
        scored = r.json()["logprobs"]
        assert call.generation_log_probs[s.start:s.end] == scored[s.start:s.end], s


async def _paused_mid_generation(http, engine, request) -> httpx.Response:
    await http.post("/tokentrail/admin/policy-version", json={"version": "v0"}, headers=ADMIN)
    task = asyncio.ensure_future(request)
    await asyncio.sleep(0.5)
    assert not task.done()
    await _weight_sync(http, engine, "v1")
    return await task


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_continue_answers_once_and_the_capture_is_token_exact_across_both_versions(rig, publisher, stream):
    http, engine = await rig(abort_policy="continue")
    r = await _paused_mid_generation(http, engine, http.post(CHAT.format(rid="cont"), json=_body(stream)))
    assert r.status_code == 200, r.text
    if stream:
        events = [json.loads(line[5:]) for line in r.text.splitlines() if line.startswith("data: {")]
        finishes = [c["choices"][0]["finish_reason"] for c in events if c.get("choices")]
        assert [f for f in finishes if f] == ["length"]  # one answer: the abort never reached the harness
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in events if c.get("choices"))
    else:
        text = r.json()["choices"][0]["message"]["content"]
        assert r.json()["choices"][0]["finish_reason"] == "length"
    (call,) = [e.body for e in publisher.events if isinstance(e.body, CallCaptured)]
    assert not [e for e in publisher.events if isinstance(e.body, CallIncomplete)]
    assert call.facts.continued == 1 and len(call.generation_token_ids) == 400
    versions = [s.version for s in call.facts.version_spans]
    # The engine's own spans when it gives them (vLLM 0.33; "default" is its unnamed first weights),
    # else each part's announced version.
    first = "default" if call.facts.version_spans_source == "engine" else "v0"
    assert versions == [first, "v1"], (call.facts.version_spans_source, call.facts.version_spans)
    assert 0 < call.facts.version_spans[0].end < 400
    await _token_exact(engine, call)
    # The harness's text is the text of exactly the captured tokens.
    detok = await engine.post("/detokenize", json={"model": "tokentrail-policy", "tokens": call.generation_token_ids})
    if detok.status_code == 200:
        assert detok.json()["prompt"] == text


async def test_mask_refuses_the_aborted_call_and_its_retry_names_it(rig, publisher):
    http, engine = await rig()  # abort_policy="mask", the default
    r = await _paused_mid_generation(http, engine, http.post(CHAT.format(rid="mask"), json=_body(False)))
    assert r.status_code == 503 and r.headers["x-should-retry"] == "true"
    (aborted,) = [e.body for e in publisher.events if isinstance(e.body, CallIncomplete)]
    assert aborted.reason == "aborted"
    retry = await http.post(CHAT.format(rid="mask"), json=_body(False))
    assert retry.status_code == 200
    (call,) = [e.body for e in publisher.events if isinstance(e.body, CallCaptured)]
    assert call.facts.retry_of == aborted.model_call_id and call.facts.continued == 0
    assert [s.version for s in call.facts.version_spans] == ["v1"]
    other = await http.post(CHAT.format(rid="mask"), json=_body(False))  # a second retry retries nothing
    assert other.status_code == 200
    assert [e.body for e in publisher.events if isinstance(e.body, CallCaptured)][-1].facts.retry_of == ""


async def test_a_continued_stream_reaches_a_translated_harness_as_one_answer(rig, publisher, monkeypatch):
    # Claude Code's dialect: the translator reads the capture's reading of each chunk, and the aborted part's
    # last chunk is read without its finish, so the harness sees one message that stops once.
    to_chat = anthropic.to_chat_request  # the Messages API has no ignore_eos: the generation must run long
    monkeypatch.setattr(anthropic, "to_chat_request", lambda body: {**to_chat(body), "ignore_eos": True})
    http, engine = await rig(abort_policy="continue")
    body = {"model": "tokentrail-policy", "max_tokens": 400, "stream": True, "temperature": 1.0,
            "messages": [{"role": "user", "content": "go"}]}
    r = await _paused_mid_generation(
        http, engine, http.post("/ng-rollout/cont-anthropic/training-token-capture/v1/messages", json=body))
    assert r.status_code == 200, r.text
    names = [line[7:] for line in r.text.splitlines() if line.startswith("event: ")]
    assert "error" not in names and names.count("message_stop") == 1 and names[-1] == "message_stop", names
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    (delta,) = [e for e in events if e["type"] == "message_delta"]
    assert delta["delta"]["stop_reason"] == "max_tokens"
    (call,) = [e.body for e in publisher.events if isinstance(e.body, CallCaptured)]
    assert call.facts.continued == 1 and len(call.generation_token_ids) == 400
