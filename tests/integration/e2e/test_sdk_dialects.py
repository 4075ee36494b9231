"""All three dialects, streaming and not, with the real SDKs through the whole pipeline, on both
engines: each rollout rebuilds as one unmasked chain and re-scoring by the engine reproduces every
captured log-prob, bit for bit."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from compose.harnesses.sdk import run_anthropic_rollout, run_responses_rollout, run_rollout

pytestmark = [pytest.mark.integration, pytest.mark.real_broker]

DRIVERS = {"chat": run_rollout, "anthropic": run_anthropic_rollout, "responses": run_responses_rollout}


@pytest.fixture(scope="module")
def dialect_runs(stack):
    tag = uuid.uuid4().hex[:6]
    plan = {f"{d}-{'sse' if s else 'json'}-{tag}": (d, s) for d in DRIVERS for s in (False, True)}

    async def run_all():
        def base(rid, dialect):
            url = stack.capture_base_url(rid)
            return url.removesuffix("/v1") if dialect == "anthropic" else url
        return await asyncio.gather(*(DRIVERS[d](base(rid, d), rid, "What is the weather in Paris?", stream=s)
                                      for rid, (d, s) in plan.items()))

    outcomes = {o.rollout_id: o for o in asyncio.run(run_all())}
    for o in outcomes.values():
        assert o.error is None, f"{o.rollout_id}: {o.error}"
        stack.finish(o.rollout_id, {"reward": 1.0}, final_response_id=o.final_response_id, final_text=o.final_text)
    return plan, outcomes, stack.wait_rollouts(list(plan), timeout=90)


@pytest.mark.parametrize("dialect", list(DRIVERS))
@pytest.mark.parametrize("streamed", [False, True])
def test_dialect_rollout_is_unmasked_and_token_exact(dialect_runs, stack, dialect, streamed):
    plan, outcomes, records = dialect_runs
    (rid,) = [r for r, (d, s) in plan.items() if d == dialect and s == streamed]
    rec = records[rid]
    m = rec["_ng_token_capture"]
    assert rec["mask_sample"] is False, rec["mask_reasons"]
    assert m["n_calls"] == outcomes[rid].calls >= 3 and m["chains"] == 1
    traj = rec["trajectory"]
    scored = stack.rescore(traj["token_ids"])
    assert [scored[i - 1] for i, bit in enumerate(traj["loss_mask"]) if bit] == traj["log_probs"]
