"""The converter (pure, core venv): delivered records as OpenEnv-shaped turns and GRPO rows.

What TRL and OpenEnv themselves make of the turns is ``test_trl_openenv`` (their code, in .venv-vllm).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from consumers.rebuild.staleness import apply_staleness
from consumers.trl_source import convert_rollout
from consumers.trl_source.rows import ROW_KEYS, grpo_row
from schemas.policy_versions import PolicyVersion, VersionBook
from tests.unit.consumers.trl_source.scenarios import SCENARIOS, expected_sequences, untrained_summary


def merged(converted) -> list[dict]:
    """The converted traces joined by TRL's rule (the same oracle ``expected_sequences`` uses)."""
    rows: list[dict] = []
    for t in converted.traces:
        row = {"input_ids": t.token_ids, "completion_mask": t.loss_mask, "old_log_probs": t.log_probs}
        held = rows[-1]["input_ids"] if rows else None
        if held is not None and row["input_ids"][:len(held)] == held:
            rows[-1] = {k: rows[-1][k] + row[k][len(held):] for k in row}
        else:
            rows.append(row)
    return [r for r in rows if 1 in r["completion_mask"]]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_each_trace_becomes_turns_whose_sequence_is_the_captured_one(name):
    scenario = SCENARIOS[name]()
    converted = convert_rollout(scenario.record)
    assert converted.scorable is scenario.scorable, converted.unscorable
    assert merged(converted) == expected_sequences(scenario)
    for trace in converted.traces:
        for turn in trace.turns:
            n, m = len(turn.prompt_token_ids), len(turn.completion_token_ids)
            assert turn.prompt_token_ids == trace.token_ids[:n] and n > 0
            assert turn.completion_token_ids == trace.token_ids[n:n + m]
            assert len(turn.per_token_logps) == m and all(v <= 0 for v in turn.per_token_logps)
            assert turn.loss_mask == [0] * n + trace.loss_mask[n:n + m]
            assert turn.per_token_logps == scenario.calls[turn.node_id].generation_log_probs
    ids = [t.node_id for t in converted.turns]
    assert len(ids) == len(set(ids))


def test_side_and_masked_traces_are_left_out_and_named():
    converted = convert_rollout(SCENARIOS["rich"]().record)
    assert [t.kind for t in converted.traces] == ["main", "other", "subagent", "compaction"]
    assert any("side" in e for e in converted.excluded)
    assert any("trace_unclassified" in e for e in converted.excluded)
    assert converted.traces[converted.terminal_trace].kind == "compaction"  # the segment holding the answer
    sub = convert_rollout(SCENARIOS["masked_subagent"]().record)
    assert [t.kind for t in sub.traces] == ["main"] and "non_finite_log_prob" in sub.excluded[0]


def test_a_masked_rollout_is_unscorable_with_its_reasons_and_no_turns():
    converted = convert_rollout(SCENARIOS["masked_rollout"]().record)
    assert (converted.reward, converted.traces, converted.turns) == (None, [], [])
    assert "unresolved_retry" in converted.unscorable[0]


def test_an_untrained_summary_keeps_its_log_probs_from_the_projection_and_trains_nothing():
    scenario = untrained_summary()
    converted = convert_rollout(scenario.record)
    summary = [t for t in converted.turns if set(t.loss_mask) == {0}]
    assert len(summary) == 1 and summary[0].per_token_logps == scenario.calls[summary[0].node_id].generation_log_probs
    assert converted.notes == []


def test_without_the_projection_an_untrained_summary_is_left_out_as_a_turn_and_said():
    with_projection = convert_rollout(untrained_summary().record)
    without = convert_rollout(untrained_summary(project_response=False).record)
    assert without.scorable and len(without.notes) == 1 and "no projection" in without.notes[0]
    assert len(without.turns) == len(with_projection.turns) - 1
    def trained(turns):  # call ids are minted per build: compare the tokens
        return [(t.prompt_token_ids, t.completion_token_ids, t.per_token_logps, t.loss_mask)
                for t in turns if 1 in t.loss_mask]
    assert trained(without.turns) == trained(with_projection.turns)  # nothing trained changes


@pytest.mark.parametrize("result, why", [({}, "no finite number under 'reward'"), ({"reward": "1"}, "'1'"),
                                         ({"reward": True}, "True")])
def test_a_record_without_a_numeric_reward_is_unscorable(result, why):
    record = dataclasses.replace(SCENARIOS["tool_calls"]().record, result_json=json.dumps(result))
    converted = convert_rollout(record)
    assert converted.reward is None and converted.turns == [] and why in converted.unscorable[0]


def test_the_reward_key_is_configurable():
    record = dataclasses.replace(SCENARIOS["tool_calls"]().record, result_json='{"score": 2.5}')
    assert convert_rollout(record, reward_key="score").reward == 2.5


def test_a_positive_log_prob_makes_the_rollout_unscorable_instead_of_stopping_trl():
    record = SCENARIOS["tool_calls"]().record
    traj = dataclasses.replace(record.trajectory, log_probs=[0.25] + record.trajectory.log_probs[1:])
    converted = convert_rollout(dataclasses.replace(record, trajectory=traj))
    assert converted.turns == [] and "per_token_logps[0] = 0.25" in converted.unscorable[0]


def test_a_generation_half_trained_is_a_contradiction_and_unscorable():
    record = SCENARIOS["tool_calls"]().record
    traj = record.trajectory
    span = traj.spans[1]
    mask = bytearray(traj.loss_mask)
    mask[span.generation_start] = 0
    log_probs = traj.log_probs[:3] + traj.log_probs[4:]  # one fewer loss-bearing token
    converted = convert_rollout(dataclasses.replace(
        record, trajectory=dataclasses.replace(traj, loss_mask=bytes(mask), log_probs=log_probs)))
    assert converted.turns == [] and "3 of its 4 generated tokens are loss-bearing" in converted.unscorable[0]


def test_the_policy_version_is_the_oldest_loss_bearing_one():
    record = SCENARIOS["tool_calls"]().record
    book = VersionBook([PolicyVersion("v1", 3), PolicyVersion("v2", 4)])
    converted = convert_rollout(record, book=book)
    assert (converted.policy_version, converted.policy_step) == ("v1", 3)
    # without a book: what the consumer recorded at delivery, its step unknown
    delivered = apply_staleness(record, book, None)
    assert (convert_rollout(delivered).policy_version, convert_rollout(delivered).policy_step) == ("v1", None)
    assert convert_rollout(record).policy_version is None
    versions = [v["version"] for t in converted.turns for v in t.metadata["version_spans"]]
    assert versions == ["v1", "v2"]


def test_a_grpo_row_is_the_terminal_trace_split_at_its_first_prompt():
    scenario = SCENARIOS["tool_calls"]()
    converted = convert_rollout(scenario.record)
    row = grpo_row(scenario.record, converted, fallback_token_id=0)
    assert set(row) == set(ROW_KEYS)
    traj = scenario.record.trajectory
    cut = traj.spans[0].generation_start
    assert row["prompt_ids"] == traj.token_ids[:cut] and row["completion_ids"] == traj.token_ids[cut:]
    assert row["env_mask"] == list(traj.loss_mask[cut:])
    assert [lp for lp, m in zip(row["logprobs"], row["env_mask"]) if m] == traj.log_probs
    assert row["tokentrail_reward"] == 0.75 and row["tokentrail_dropped"] == []


def test_a_grpo_row_of_a_tree_names_the_traces_one_row_cannot_hold():
    scenario = SCENARIOS["rich"]()
    row = grpo_row(scenario.record, convert_rollout(scenario.record), fallback_token_id=0)
    assert len(row["tokentrail_dropped"]) == 3  # main (segment 0), the fork, the sub-agent
    assert row["prompt_ids"] + row["completion_ids"] == scenario.record.trajectory.token_ids


def test_an_unscorable_grpo_row_trains_nothing():
    scenario = SCENARIOS["masked_rollout"]()
    row = grpo_row(scenario.record, convert_rollout(scenario.record), fallback_token_id=7)
    assert row["tokentrail_reward"] is None and set(row["env_mask"]) <= {0} and row["completion_ids"]
    assert len(row["logprobs"]) == len(row["completion_ids"]) == len(row["env_mask"])
    empty = grpo_row(None, convert_rollout(scenario.record), fallback_token_id=7)
    assert (empty["completion_ids"], empty["env_mask"], empty["tokentrail_reward"]) == ([7], [0], None)


def test_the_converter_and_rows_import_no_trl_openenv_torch_or_pydantic():
    code = ("import sys, consumers.trl_source, consumers.trl_source.rows; "
            "print(sorted(m for m in ('trl', 'openenv', 'torch', 'pydantic', 'confluent_kafka') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_consumer_package_and_its_loop_do_not_load_the_plugin():
    code = ("import sys, consumers, consumers.loop, consumers.trainer_stream, consumers.sinks.plugin; "
            "print([m for m in sys.modules if m.startswith('consumers.trl_source')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
