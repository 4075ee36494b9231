"""vLLM 0.34's checkpoint drain through the interceptor (stand-in engine in process, ``sleep_mode``).

``POST /checkpoint/prepare?mode=abort`` ends every generation in flight with finish_reason
``"abort"``, as ``/pause?mode=abort`` does; the capture records it as ``--abort-policy`` says:
``mask`` writes CallIncomplete(aborted) and tells the harness to retry (503 with ``x-should-retry``;
a stream that had started ends with an ``engine_aborted`` error event); ``continue`` resubmits prompt + partial generation once the engine is restored
and answers once, the capture one call across both parts.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from schemas.records import CallCaptured, CallIncomplete

CHAT = "/ng-rollout/{rid}/training-token-capture/v1/chat/completions"
BODY = {"model": "tokentrail-policy", "messages": [{"role": "user", "content": "go"}], "max_tokens": 300,
        "ignore_eos": True, "temperature": 1.0}


@pytest.fixture
def rig(policy_rig):
    """The interceptor over the stand-in with sleep mode on (the checkpoint routes)."""
    return lambda **overrides: policy_rig({"sleep_mode": True}, **overrides)


async def _checkpointed(engine: httpx.AsyncClient, request) -> httpx.Response:
    """Start ``request``, drain the engine for a checkpoint with mode=abort mid-generation, restore it."""
    task = asyncio.ensure_future(request)
    await asyncio.sleep(0.4)
    assert not task.done()
    prepared = await engine.post("/checkpoint/prepare", params={"mode": "abort"})
    assert prepared.json() == {"state": "prepared"}
    await asyncio.sleep(0.05)  # the checkpoint is taken meanwhile
    assert (await engine.post("/checkpoint/restore")).json() == {"state": "running"}
    return await task


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_mask_records_the_checkpoint_abort_and_the_harness_retries(rig, publisher, stream):
    http, engine = await rig()  # abort_policy="mask", the default
    r = await _checkpointed(engine, http.post(CHAT.format(rid=f"ckpt-{stream}"), json={**BODY, "stream": stream}))
    if stream:  # the answer had started: the abort arrives as the stream's error event, never as a finish
        assert r.status_code == 200 and "engine_aborted" in r.text and '"abort"' not in r.text.replace(" ", "")
    else:
        assert r.status_code == 503 and r.headers["x-should-retry"] == "true"
    (aborted,) = [e.body for e in publisher.events if isinstance(e.body, CallIncomplete)]
    assert aborted.reason == "aborted"
    assert not [e for e in publisher.events if isinstance(e.body, CallCaptured)]
    retry = await http.post(CHAT.format(rid=f"ckpt-{stream}"), json={**BODY, "stream": stream})
    assert retry.status_code == 200
    (call,) = [e.body for e in publisher.events if isinstance(e.body, CallCaptured)]
    assert call.facts.retry_of == aborted.model_call_id


async def test_continue_answers_once_across_the_checkpoint(rig, publisher):
    http, engine = await rig(abort_policy="continue")
    r = await _checkpointed(engine, http.post(CHAT.format(rid="ckpt-cont"), json=BODY))
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"
    (call,) = [e.body for e in publisher.events if isinstance(e.body, CallCaptured)]
    assert not [e for e in publisher.events if isinstance(e.body, CallIncomplete)]
    assert call.facts.continued == 1 and len(call.generation_token_ids) == 300
