"""End to end with real processes and a real broker: OpenAI SDK harness → interceptor → Kafka →
Faust fold → rebuild consumer → JSONL; then prove the delivered trajectories token-exact."""

from __future__ import annotations

import asyncio
import uuid

import httpx
import pytest

from compose.harnesses.sdk import fault_tool, run_rollout

pytestmark = [pytest.mark.integration, pytest.mark.real_broker]


@pytest.fixture(scope="module")
def delivered(stack):
    tag = uuid.uuid4().hex[:6]
    clean = [f"clean-{tag}-{i}" for i in range(3)]
    broken = f"broken-{tag}"

    async def run_all():
        return await asyncio.gather(
            *(run_rollout(stack.capture_base_url(r), r, f"weather in city {i}?", tool_calls=2)
              for i, r in enumerate(clean)),
            run_rollout(stack.capture_base_url(broken), broken, "weather in Oslo?",
                        tool_impl=fault_tool(stack.upstream_kind, 1)),
        )

    outcomes = {o.rollout_id: o for o in asyncio.run(run_all())}
    for o in outcomes.values():
        stack.finish(o.rollout_id, {"reward": 0.0 if o.error else 1.0},
                     final_response_id=o.final_response_id, final_text=o.final_text)
    records = stack.wait_rollouts([*clean, broken], timeout=90)
    return clean, broken, outcomes, records


def test_clean_rollouts_are_unmasked_single_chains(delivered):
    clean, _, outcomes, records = delivered
    for rid in clean:
        rec = records[rid]
        m = rec["_ng_token_capture"]
        assert outcomes[rid].error is None and outcomes[rid].calls == 3
        assert rec["mask_sample"] is False and rec["mask_reasons"] == []
        assert (m["n_calls"], m["roots"], m["chains"], m["delivered_fraction"]) == (3, 1, 1, 1.0)
        assert rec["result"] == {"reward": 1.0}


# What each engine's mid-rollout failure looks like: an injected 5xx, or vLLM refusing a prompt
# longer than its context (no tokens were generated, but the rollout lost a turn).
FAULTS = {"reference": ("500", "upstream_error"), "vllm": ("400", "engine_rejected")}


def test_broken_rollout_is_masked_with_its_reason(delivered, stack):
    _, broken, outcomes, records = delivered
    status, incomplete_reason = FAULTS[stack.upstream_kind]
    assert outcomes[broken].error and status in outcomes[broken].error
    rec = records[broken]
    assert rec["mask_sample"] is True
    (reason,) = [r for r in rec["mask_reasons"] if r["code"] == "capture_incomplete"]
    assert reason["detail"].startswith(incomplete_reason) and len(reason["call_ids"]) == 1


def test_rescoring_reproduces_every_captured_log_prob_and_the_loss_mask(delivered, stack):
    clean, _, outcomes, records = delivered
    for rid in clean:
        traj = records[rid]["trajectory"]
        ids, mask, log_probs = traj["token_ids"], traj["loss_mask"], traj["log_probs"]
        scored = stack.rescore(ids)
        generated = [i for i, m in enumerate(mask) if m == 1]
        assert len(generated) == len(log_probs)
        # exact equality: the captured floats are the engine's own, bit for bit
        assert [scored[i - 1] for i in generated] == log_probs
        # loss mask: generated spans are exactly the calls' generations; tool output is prompt (0)
        spans = traj["spans"]
        assert [i for s in spans for i in range(s["generation_start"], s["end"])] == generated
        for result in outcomes[rid].tool_results:
            text_ids = httpx.post(f"{stack.policy_url}/tokenize", json={"prompt": result},
                                  timeout=30).json()["tokens"]
            start = _find(ids, text_ids)
            assert start >= 0, "tool output tokens are in the trajectory"
            assert set(mask[start:start + len(text_ids)]) == {0}, "tool output is never trained on"


def _find(haystack: list[int], needle: list[int]) -> int:
    n = len(needle)
    return next((i for i in range(len(haystack) - n + 1) if haystack[i:i + n] == needle), -1)
