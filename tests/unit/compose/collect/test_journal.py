"""The run journal: durable, resumable, refuses another run's file, survives a torn last line."""

from __future__ import annotations

import json

import pytest

from compose.collect.journal import Journal, JournalError, RunHeader, rollout_ids
from schemas.ids import validate_rollout_id


def _header(**kw) -> RunHeader:
    base = dict(run_id="r1", harness="openai-sdk", samples=2, tasks_digest="d" * 64, started_ms=1000)
    return RunHeader(**{**base, **kw})


def test_entries_survive_a_reopen(tmp_path):
    path = tmp_path / "j.jsonl"
    j = Journal.open(path, _header())
    j.record_attempt("t-0", 0, "r1.t-0")
    j.record_failure("t-0", 0, {"failure_class": "timeout", "detail": "x", "terminal": False})
    j.record_attempt("t-0", 1, "r1.t-0.a1")
    j.record_finish("t-0", 1, {"result": {"reward": 1.0}, "attempt": 1})
    again = Journal.open(path, _header(started_ms=5))
    assert again.header == _header()  # the file's header (its start time) stands, not the fresh one
    (a0, a1) = again.attempts("t-0")
    assert a0.failure["failure_class"] == "timeout" and a0.finish is None
    assert a1.rollout_id == "r1.t-0.a1" and a1.finish == {"result": {"reward": 1.0}, "attempt": 1}


@pytest.mark.parametrize("field,value", [("harness", "codex"), ("samples", 3), ("tasks_digest", "e" * 64)])
def test_another_runs_journal_is_refused_naming_the_field(tmp_path, field, value):
    path = tmp_path / "j.jsonl"
    Journal.open(path, _header())
    with pytest.raises(JournalError, match=field):
        Journal.open(path, _header(**{field: value}))


def test_another_run_id_is_refused(tmp_path):
    path = tmp_path / "j.jsonl"
    Journal.open(path, _header())
    with pytest.raises(JournalError, match="belongs to run 'r1', not 'other'"):
        Journal.open(path, _header(run_id="other"))


def test_a_torn_last_line_is_ignored_but_a_damaged_middle_is_refused(tmp_path):
    path = tmp_path / "j.jsonl"
    j = Journal.open(path, _header())
    j.record_attempt("t-0", 0, "r1.t-0")
    with open(path, "ab") as f:
        f.write(b'{"type":"finish","key":"t-0","att')  # killed mid-write
    assert Journal.open(path, _header()).attempts("t-0")[0].finish is None
    lines = path.read_bytes().split(b"\n")
    path.write_bytes(lines[0] + b"\nnot json\n" + lines[1] + b"\n")
    with pytest.raises(JournalError, match=":2"):
        Journal.open(path, _header())


def test_a_file_that_is_not_a_journal_is_refused(tmp_path):
    path = tmp_path / "j.jsonl"
    path.write_text(json.dumps({"key": "x"}) + "\n")
    with pytest.raises(JournalError, match="not a run header"):
        Journal.open(path, _header())


def test_rollout_ids_give_each_attempt_its_own_id():
    ids = {rollout_ids("run7", "arith-001", s, a) for s in range(3) for a in range(3)}
    assert len(ids) == 9 and all(validate_rollout_id(i) for i in ids)
    assert rollout_ids("run7", "arith-001", 1, 0) == "run7.arith-001-1"
    assert rollout_ids("run7", "arith-001", 1, 2) == "run7.arith-001-1.a2"
    # A task's declared _ng_rollout_id is honoured (alone with one sample, numbered with several).
    assert rollout_ids("run7", "t", 0, 0, declared="gym-42") == "gym-42"
    assert rollout_ids("run7", "t", 1, 1, declared="gym-42", samples=2) == "gym-42-1.a1"
