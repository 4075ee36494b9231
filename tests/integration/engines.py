"""Shared by the integration suites: the real-vLLM tier's gate (skip with the install command
locally, fail under CI), and the check every harness's delivered rollout must pass on either engine."""

from __future__ import annotations

import os
from typing import Any

import pytest

from compose.vllm_engine.engine import unavailable_reason


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
