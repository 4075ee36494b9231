"""Shared by the integration suites: the real-vLLM tier's gate (skip with the install command
locally, fail under CI), and the checks every harness's delivered rollout must pass on either engine
(one token-exact chain; with ``delivery_mode="traces"``, every trace token-exact and every generated
token loss-bearing once), and the stack the traces tests share."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from compose.engines.vllm_rig.engine import unavailable_reason
from compose.rig.stack import LocalStack


def require_vllm() -> None:
    """Skip when the engine environment is missing, except under CI or TOKENTRAIL_REQUIRE_VLLM=1 (then fail)."""
    reason = unavailable_reason()
    if reason is None:
        return
    if os.environ.get("CI") or os.environ.get("TOKENTRAIL_REQUIRE_VLLM") == "1":
        pytest.fail(f"the real-vLLM tier must run here: {reason}")
    pytest.skip(reason)


def assert_one_token_exact_chain(stack: Any, record: dict, *, min_calls: int = 3) -> None:
    """Unmasked, one root and one chain holding every call, and the engine's re-score of the
    delivered ids equal to every captured log-prob, bit for bit."""
    m = record["_ng_token_capture"]
    assert record["mask_sample"] is False, record["mask_reasons"]
    assert m["n_calls"] >= min_calls and m["chains"] == 1 and m["roots"] == 1 and m["delivered_fraction"] == 1.0
    traj = record["trajectory"]
    scored = stack.rescore(traj["token_ids"])
    generated = [i for i, bit in enumerate(traj["loss_mask"]) if bit]
    assert generated and [scored[i - 1] for i in generated] == traj["log_probs"]


def expanded(traces: list[dict], index: int) -> tuple[list[int], list[int], list[float]]:
    """Trace ``index``'s whole token ids, loss mask (0 over the shared prefix) and log-probs."""
    trace = traces[index]
    traj = trace["trajectory"]
    tokens: list[int] = []
    if trace["prefix_trace"] >= 0:
        assert trace["prefix_trace"] < index, f"trace {index} takes its prefix from a later trace"
        tokens = expanded(traces, trace["prefix_trace"])[0][:trace["prefix_len"]]
        assert len(tokens) == trace["prefix_len"]
    else:
        assert trace["prefix_len"] == 0
    return tokens + traj["token_ids"], [0] * len(tokens) + traj["loss_mask"], traj["log_probs"]


def assert_traces_exact(stack: Any, record: dict) -> list[dict]:
    """Unmasked; every trace token-exact; every generated token loss-bearing in exactly one trace."""
    assert record["mask_sample"] is False, record["mask_reasons"]
    traces = record["traces"]
    m = record["_ng_token_capture"]
    for index, trace in enumerate(traces):
        assert trace["mask_sample"] is False, (index, trace["kind"], trace["mask_reasons"])
        assert trace["trajectory"] is not None, (index, trace["kind"])
        tokens, loss_mask, log_probs = expanded(traces, index)
        scored = stack.rescore(tokens)
        generated = [i for i, bit in enumerate(loss_mask) if bit]
        assert len(generated) == trace["_ng_token_capture"]["loss_tokens"] == len(log_probs)
        assert generated and [scored[i - 1] for i in generated] == log_probs, (index, trace["kind"])
    assert sum(t["_ng_token_capture"]["loss_tokens"] for t in traces) == m["generated_tokens_captured"] > 0
    owned = [cid for t in traces for cid in t["call_ids"]]
    assert len(owned) == len(set(owned)) == m["n_calls"], "a call is in two traces, or in none"
    return traces


def traces_stack(kafka_bootstrap: str, directory: Path, name: str, rollout_secret: str) -> LocalStack:
    """A stack on the reference policy whose consumer delivers traces; a harness's ~40-50 KB system
    prompt and tools need the long context."""
    tag = f"{name}{uuid.uuid4().hex[:8]}"
    return LocalStack(kafka_bootstrap, directory, topic_prefix=f"{tag}.", processor_id=tag,
                      policy_args=("--max-model-len", "262144"), rollout_secret=rollout_secret,
                      consumer_args=("--rules", json.dumps({"delivery_mode": "traces"})))
