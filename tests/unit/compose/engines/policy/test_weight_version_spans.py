"""Per-token weight versions across a weight update, as vLLM reports them (vllm_0.33.md §1, §5).

vLLM stamps every engine step with its current label (``vllm/v1/engine/core.py``
``_attach_weight_version``) and the output processor turns the labels into spans; a
generation frozen by ``POST /pause?mode=keep`` whose weights are relabelled before
``/resume`` reports the tokens before the pause under the old label and the rest under
the new one, and the rest is sampled from the new weights.
"""

from __future__ import annotations

import asyncio

import pytest

from compose.engines.policy.protocol import weight_version_spans
from compose.engines.policy.testkit import chat, chat_stream, user_turn

LONG = dict(messages=user_turn(), max_tokens=60, ignore_eos=True, return_token_ids=True, logprobs=True, seed=1,
            return_weight_versions=True)

# Per-token labels -> vLLM's spans, from vllm 0.32's vllm/v1/engine/output_processor.py:484-498
# (track_weight_version appends (label, num_output_tokens()) when the label differs from the last
# one, called at :764-765 *before* the step's tokens are counted, so a span starts at the index of
# its first token; _weight_version_spans ends each span at the next start, the last at the token
# count; no tokens and no labels -> []). The expected values were produced by running those two
# methods of the installed 0.32 engine on one-token steps carrying these labels.
VLLM_SPANS = [
    (["default"] * 3 + ["v1"] * 2,
     [{"version": "default", "start": 0, "end": 3}, {"version": "v1", "start": 3, "end": 5}]),
    ([], []),
    (["default", "default"], [{"version": "default", "start": 0, "end": 2}]),
    (["a", "b", "a"], [{"version": "a", "start": 0, "end": 1}, {"version": "b", "start": 1, "end": 2},
                       {"version": "a", "start": 2, "end": 3}]),
]


@pytest.mark.parametrize(("labels", "spans"), VLLM_SPANS)
def test_spans_are_vllms_run_lengths_of_the_per_token_labels(labels, spans):
    assert weight_version_spans(labels) == spans


async def _soon(coro, delay: float = 0.15):
    task = asyncio.ensure_future(coro)
    await asyncio.sleep(delay)
    return task


@pytest.fixture
async def slow(make_client):
    """A server whose generations take time (10 ms a token), warmed up so a request starts at once."""
    client = make_client(decode_ms_per_token=10)
    await chat(client, messages=user_turn(), max_tokens=1)
    return client


async def _relabel_during_keep_pause(client, version: str = "v1") -> None:
    assert (await client.post("/pause", params={"mode": "keep"})).json() == {"status": "paused"}
    await asyncio.sleep(0.05)
    answer = await client.post("/update_weight_version", json={"new_version": version})
    assert answer.json() == {"success": True, "new_version": version}
    assert (await client.post("/resume")).json() == {"status": "resumed"}


async def _score(client, prompt: list[int], generated: list[int], version: str) -> list[float]:
    answer = await client.post("/tokentrail/score", json={"token_ids": prompt + generated, "start": len(prompt),
                                                           "weight_version": version})
    assert answer.status_code == 200, answer.text
    return answer.json()["logprobs"]


async def _assert_split(client, prompt, ids, logprobs, spans, reference_ids) -> int:
    """Two spans meeting at k; tokens before k are the unrelabelled generation's and scored by the
    old weights, tokens from k on are scored (and were sampled) by the new ones."""
    assert [s["version"] for s in spans] == ["default", "v1"]
    k = spans[0]["end"]
    assert spans == [{"version": "default", "start": 0, "end": k}, {"version": "v1", "start": k, "end": len(ids)}]
    assert 0 < k < len(ids)
    assert ids[:k] == reference_ids[:k]  # the same generation up to the pause
    assert ids[k:] != reference_ids[k:]  # then the new weights' tokens
    assert logprobs[:k] == (await _score(client, prompt, ids, "default"))[:k]
    assert logprobs[k:] == (await _score(client, prompt, ids, "v1"))[k:]
    return k


async def test_a_stream_relabelled_during_a_keep_pause_reports_two_spans(slow):
    client = slow
    reference = await chat(client, **LONG)
    task = await _soon(chat_stream(client, **LONG, stream_options={"include_usage": True}))
    await _relabel_during_keep_pause(client)
    chunks = await asyncio.wait_for(task, 10)
    first, *tokens, terminal, usage = chunks
    ids = [i for c in tokens + [terminal] for i in c["choices"][0]["token_ids"]]
    logprobs = [e["logprob"] for c in tokens + [terminal] for e in c["choices"][0]["logprobs"]["content"]]
    (choice,) = terminal["choices"]
    assert choice["finish_reason"] == "length" and len(ids) == 60 == usage["usage"]["completion_tokens"]
    assert all("weight_versions" not in c["choices"][0] for c in tokens)  # the terminal chunk only
    await _assert_split(client, first["prompt_token_ids"], ids, logprobs, choice["weight_versions"],
                        reference["choices"][0]["token_ids"])


async def test_a_non_streamed_generation_relabelled_during_a_keep_pause_reports_two_spans(slow):
    client = slow
    reference = await chat(client, **LONG)
    task = await _soon(chat(client, **LONG, top_logprobs=1))
    await _relabel_during_keep_pause(client)
    data = await asyncio.wait_for(task, 10)
    (choice,) = data["choices"]
    ids = choice["token_ids"]
    content = choice["logprobs"]["content"]
    assert choice["finish_reason"] == "length" and len(ids) == 60
    await _assert_split(client, data["prompt_token_ids"], ids, [e["logprob"] for e in content],
                        choice["weight_versions"], reference["choices"][0]["token_ids"])
    # top_logprobs lists the sampled token first, from the table it was sampled with
    assert all(e["top_logprobs"][0]["logprob"] == e["logprob"] for e in content)


async def test_every_choice_splits_at_the_same_step(slow):
    client = slow
    task = await _soon(chat(client, **LONG, n=2))
    await _relabel_during_keep_pause(client)
    data = await asyncio.wait_for(task, 10)
    spans = [c["weight_versions"] for c in data["choices"]]
    assert spans[0] == spans[1] and [s["version"] for s in spans[0]] == ["default", "v1"]


async def test_a_streamed_abort_after_the_update_reports_the_spans_of_what_was_generated(slow):
    client = slow
    task = await _soon(chat_stream(client, **LONG))
    await _relabel_during_keep_pause(client)
    await asyncio.sleep(0.1)
    await client.post("/pause", params={"mode": "abort"})
    chunks = await asyncio.wait_for(task, 10)
    await client.post("/resume")
    first, *tokens, terminal = chunks
    ids = [i for c in tokens for i in c["choices"][0]["token_ids"]]
    (choice,) = terminal["choices"]
    assert choice["finish_reason"] == "abort" and choice["token_ids"] == [] and 0 < len(ids) < 60
    spans = choice["weight_versions"]
    assert [s["version"] for s in spans] == ["default", "v1"]
    assert spans[0]["start"] == 0 and spans[0]["end"] == spans[1]["start"] and spans[1]["end"] == len(ids)
    logprobs = [e["logprob"] for c in tokens for e in c["choices"][0]["logprobs"]["content"]]
    k = spans[1]["start"]
    assert logprobs[k:] == (await _score(client, first["prompt_token_ids"], ids, "v1"))[k:]


async def test_a_non_streamed_abort_reports_the_spans_of_what_was_generated(slow):
    client = slow
    task = await _soon(chat(client, **LONG))
    await _relabel_during_keep_pause(client)
    await asyncio.sleep(0.1)
    await client.post("/pause", params={"mode": "abort"})
    data = await asyncio.wait_for(task, 10)
    (choice,) = data["choices"]
    n = len(choice["token_ids"])
    assert choice["finish_reason"] == "abort" and 0 < n < 60
    spans = choice["weight_versions"]
    assert [s["version"] for s in spans] == ["default", "v1"] and spans[1]["end"] == n
    # a request queued while paused and aborted before its first token generated nothing: no spans
    waiting = await _soon(chat(client, **LONG), 0.05)
    assert (await client.post("/abort_requests", json={})).json()["aborted"] == 1
    empty = (await asyncio.wait_for(waiting, 10))["choices"][0]
    assert empty["finish_reason"] == "abort" and empty["token_ids"] == [] and empty["weight_versions"] == []
    await client.post("/resume")


async def test_a_request_queued_across_an_update_is_generated_by_the_new_weights(slow):
    client = slow
    await client.post("/pause", params={"mode": "keep"})
    waiting = await _soon(chat(client, **{**LONG, "max_tokens": 8}), 0.05)
    await client.post("/update_weight_version", json={"new_version": "v1"})
    await client.post("/resume")
    data = await asyncio.wait_for(waiting, 10)
    (choice,) = data["choices"]
    assert choice["weight_versions"] == [{"version": "v1", "start": 0, "end": 8}]
    scored = await _score(client, data["prompt_token_ids"], choice["token_ids"], "v1")
    assert [e["logprob"] for e in choice["logprobs"]["content"]] == scored


async def test_without_an_update_a_keep_pause_keeps_one_span(slow):
    client = slow
    task = await _soon(chat(client, **LONG))
    await client.post("/pause", params={"mode": "keep"})
    await asyncio.sleep(0.05)
    await client.post("/resume")
    data = await asyncio.wait_for(task, 10)
    assert data["choices"][0]["weight_versions"] == [{"version": "default", "start": 0, "end": 60}]
