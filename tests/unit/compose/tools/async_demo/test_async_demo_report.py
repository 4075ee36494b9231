"""What the async demo reads off a delivered record: per-token versions for the trainer, staleness, the row."""

from __future__ import annotations

import pytest

from compose.tools.async_demo.report import DemoOptions, DemoResult, rollout_row, sample_of


def _record(**overrides):
    # Two calls: prompt 0..3, generated 4..7 (crossed an update at 6), then prompt 8..9, generated 10..11.
    record = {
        "rollout_id": "da1-g0-r0", "mask_sample": False, "mask_reasons": [], "result": {"reward": 0.25},
        "_ng_token_capture": {},
        "trajectory": {
            "token_ids": list(range(12)), "loss_mask": [0] * 4 + [1] * 4 + [0] * 2 + [1] * 2,
            "log_probs": [-1.0] * 6,
            "spans": [
                {"version_spans": [{"version": "step-0", "start": 4, "end": 6},
                                   {"version": "step-1", "start": 6, "end": 8}]},
                {"version_spans": [{"version": "step-1", "start": 10, "end": 12}]},
            ],
        },
    }
    record.update(overrides)
    return record


def test_each_generated_token_gets_the_version_of_the_span_holding_it():
    sample = sample_of(_record(), rewards={})
    assert sample["versions"] == ["step-0", "step-0", "step-1", "step-1", "step-1", "step-1"]
    assert sample["reward"] == 0.25 and sample["masked"] is False


def test_a_masked_or_trajectoryless_member_is_masked_for_the_trainer():
    assert sample_of(_record(mask_sample=True), rewards={})["masked"] is True
    bare = sample_of(_record(trajectory=None), rewards={})
    assert bare["masked"] is True and bare["token_ids"] == []


def test_staleness_is_the_consumers_when_it_reported_one_else_computed_from_the_announced_steps():
    steps = {"step-0": 0, "step-1": 1, "step-2": 2}
    computed = rollout_row(_record(), {}, steps, current_step=2)
    assert (computed["staleness"], computed["staleness_source"]) == (2, "computed")
    assert computed["labels"] == ["step-0", "step-1"] and computed["crossed"] is True
    reported = rollout_row(_record(_ng_token_capture={"policy_staleness": 1}), {}, steps, current_step=2)
    assert (reported["staleness"], reported["staleness_source"]) == (1, "consumer")
    unknown = rollout_row(_record(), {}, {"step-1": 1}, current_step=2)  # step-0 never announced
    assert unknown["staleness"] is None


def test_the_harness_reward_wins_over_the_records_and_the_options_refuse_nonsense():
    assert rollout_row(_record(), {"da1-g0-r0": 0.5}, {}, 0)["reward"] == 0.5
    with pytest.raises(ValueError, match="group_size"):
        DemoOptions(group_size=1)
    assert DemoResult([], [], [1.0, 2.0], [1.0, 2.5]).max_change == 0.5
