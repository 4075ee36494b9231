"""Result rows and the summary: one standing row per rollout, failure rows never training data."""

from __future__ import annotations

from compose.collect.outcome import Failure, FailureClass
from compose.collect.results import ResultsFile, failure_row, success_row
from compose.collect.summary import rollout_table, summarize

IDS = dict(run_id="r", task_id="t", sample=0, group_id="r.t", attempt=0, rollout_id="r.t-0", harness="remote",
           wall_s=1.0)


def _ok(key: str, task: str, reward: float, masked: bool = False) -> dict:
    record = {"mask_sample": masked, "mask_reasons": [{"code": "late_write", "detail": ""}] if masked else [],
              "_ng_token_capture": {"n_calls": 3}}
    return success_row(record=record, reward=reward, verdict={"reward": reward}, final_text="x", trajectory_path=None,
                       **{**IDS, "key": key, "task_id": task})


def test_failure_rows_are_masked_sentinels_with_their_class():
    row = failure_row(Failure(FailureClass.SCHEMA, "bad object"), attempts=1, **{**IDS, "key": "t-0"})
    assert row["reward"] == 0.0 and row["mask_sample"] is True and row["terminal"] is True
    assert row["mask_reasons"] == [{"code": "schema_error", "detail": "bad object"}]
    assert failure_row(Failure(FailureClass.TIMEOUT, ""), attempts=2, **{**IDS, "key": "t-0"})["terminal"] is False


def test_compact_keeps_one_row_per_key_and_drops_retried_ones(tmp_path):
    path = tmp_path / "out.jsonl"
    f = ResultsFile(path)
    f.append(_ok("a-0", "a", 1.0))
    f.append(failure_row(Failure(FailureClass.TIMEOUT, ""), attempts=1, **{**IDS, "key": "b-0"}))
    f.append(_ok("a-0", "a", 0.0))  # a later row of a key stands
    with open(path, "ab") as out:
        out.write(b'{"key": "c-0", "rew')  # torn by a kill
    again = ResultsFile(path)
    assert set(again.rows) == {"a-0", "b-0"} and again.rows["a-0"]["reward"] == 0.0
    again.compact(["b-0"])
    assert [line.count('"key"') for line in path.read_text().splitlines()] == [1]
    assert set(ResultsFile(path).rows) == {"a-0"}


def test_summary_counts_rewards_masks_and_failures():
    rows = [_ok("a-0", "a", 1.0), _ok("a-1", "a", 0.0, masked=True), _ok("b-0", "b", 1.0),
            failure_row(Failure(FailureClass.TIMEOUT, "slow"), attempts=3, **{**IDS, "key": "b-1", "task_id": "b"})]
    s = summarize(rows, expected=4, wall_s=2.0, written=2)
    assert s.reward_mean == 0.5 and s.masked == 2 and s.failures == {"timeout": 1}
    assert s.mask_reasons == {"late_write": 1, "timeout": 1}
    assert s.per_task == {"a": (2, 0.5, 1), "b": (2, 0.5, 1)}
    line = s.line()
    assert "4/4 rollouts" in line and "reward mean 0.500" in line and "masked 2 (50.0%" in line
    assert "failures: timeout 1" in line and "1.00 rollouts/s" in line
    assert "a" in s.table() and "0.500" in s.table()
    assert summarize([], expected=3).line().startswith("collect: 0/3 rollouts, reward mean n/a")


def test_the_rollout_table_puts_reward_beside_mask_sample():
    rows = [_ok("a-0", "a", 1.0), _ok("a-1", "a", 0.0, masked=True),
            failure_row(Failure(FailureClass.TIMEOUT, "slow"), attempts=3, **{**IDS, "key": "b-1", "task_id": "b"})]
    lines = rollout_table(rows).splitlines()
    assert lines[0].split() == ["rollout", "reward", "mask_sample", "why"]
    assert lines[1].split()[1:] == ["1.00", "false", "-"] and lines[2].split()[1:] == ["0.00", "true", "late_write"]
    assert lines[3].split()[1:] == ["0.00", "true", "timeout"]
