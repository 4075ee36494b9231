"""The collect loop with a scripted harness and in-memory finish and records (no Kafka, no CLI):
attempts, retries, terminal failures, verifier errors, delivery, resume and stop."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from compose.collect.journal import Journal, RunHeader
from compose.collect.local import StackAddress
from compose.collect.outcome import FailureClass, HarnessOutcome
from compose.collect.run import Collector
from compose.collect.settings import CollectSettings
from compose.collect.tasks import load_tasks, tasks_digest
from compose.collect.verify import check_verifiers
from schemas.errors import TransportError
from schemas.kafka.topics import topic_names

STACK = StackAddress("127.0.0.1:1", "http://127.0.0.1:2", topic_names("t."), None)


class Harness:
    name = "scripted"

    def __init__(self, script=None, default="<answer>4</answer>"):
        self.script = script or {}  # (task id, attempt) -> HarnessOutcome | str | "hang"
        self.default = default
        self.calls: list[tuple[str, int, str]] = []

    def check(self):
        pass

    def stop_all(self):
        pass

    async def run(self, attempt):
        self.calls.append((attempt.task.id, attempt.attempt, attempt.rollout_id))
        assert attempt.workdir.is_dir() and attempt.capture_root.endswith(f"/ng-rollout/{attempt.rollout_id}/"
                                                                          "training-token-capture")
        for rel, text in attempt.task.files.items():
            assert (attempt.workdir / rel).read_text() == text
        got = self.script.get((attempt.task.id, attempt.attempt), self.default)
        if got == "hang":
            await asyncio.sleep(3600)
        return got if isinstance(got, HarnessOutcome) else HarnessOutcome(final_text=got, steps=2)


class Records:
    def __init__(self):
        self.records: dict[str, dict] = {}

    async def wait(self, rollout_id, timeout_s):
        return self.records.get(rollout_id)

    def close(self):
        pass


class Finisher:
    def __init__(self, records: Records | None, fail: set[str] = frozenset(), deliver: bool = True):
        self.records, self.fail, self.deliver = records, fail, deliver
        self.finished: list[tuple[str, dict]] = []

    async def finish(self, rollout_id, payload):
        if rollout_id in self.fail:
            raise TransportError("broker down")
        self.finished.append((rollout_id, payload))
        if self.deliver and self.records is not None:
            self.records.records[rollout_id] = {"rollout_id": rollout_id, "mask_sample": False, "mask_reasons": [],
                                                "_ng_token_capture": {"n_calls": 2}}

    async def close(self):
        pass


def _tasks(tmp_path: Path, rows=None) -> Path:
    rows = rows or [{"id": "two", "prompt": "2+2?", "answer": 4},
                    {"id": "file", "prompt": "read it", "answer": "x", "files": {"a/b.txt": "hello"}}]
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _collector(tmp_path, harness, *, finisher=None, records=None, samples=1, **kw):
    tasks_path = kw.pop("tasks_path", None) or _tasks(tmp_path)
    s = CollectSettings(tasks=tasks_path, harness="openai-sdk", out=tmp_path / "out" / "results.jsonl",
                        samples=samples, bootstrap="127.0.0.1:1", interceptor_url="http://127.0.0.1:2",
                        progress=False, **kw)
    tasks = load_tasks(s.tasks)
    s.out.parent.mkdir(parents=True, exist_ok=True)
    journal = Journal.open(s.journal_path, RunHeader("run1", s.harness, samples, tasks_digest(tasks), 0))
    records = records if records is not None else Records()
    finisher = finisher if finisher is not None else Finisher(records)
    return Collector(s, tasks, check_verifiers(tasks), harness, STACK, journal, finisher=finisher, records=records)


def _rows(c: Collector) -> dict[str, dict]:
    return {json.loads(line)["key"]: json.loads(line) for line in c.s.out.read_text().splitlines()}


async def test_every_rollout_is_verified_finished_and_delivered(tmp_path):
    c = _collector(tmp_path, Harness(), samples=2)
    summary = await c.run()
    rows = _rows(c)
    assert sorted(rows) == ["file-0", "file-1", "two-0", "two-1"]
    assert rows["two-1"]["reward"] == 1.0 and rows["file-0"]["reward"] == 0.0
    assert rows["two-0"]["rollout_id"] == "run1.two-0" and rows["two-0"]["group_id"] == "run1.two"
    assert all(r["mask_sample"] is False and r["_ng_token_capture"] == {"n_calls": 2} for r in rows.values())
    assert json.loads(Path(rows["two-0"]["trajectory_path"]).read_text())["rollout_id"] == "run1.two-0"
    payload = dict(c.finisher.finished)["run1.two-1"]
    assert payload["attempt"] == 0 and payload["final_text"] == "<answer>4</answer>"
    assert payload["result"]["reward"] == 1.0 and payload["result"]["group_id"] == "run1.two"
    assert payload["result"]["group_size"] == 2 and payload["result"]["verifier"]["extracted"] == "4"
    assert summary.rollouts == 4 and summary.reward_mean == 0.5
    assert not (c.s.work_dir / "run1.two-0").exists(), "working directories are removed"


async def test_a_non_terminal_failure_is_retried_under_a_new_rollout_id(tmp_path):
    h = Harness({("two", 0): HarnessOutcome.failed(FailureClass.TIMEOUT, "slow")})
    c = _collector(tmp_path, h)
    await c.run()
    row = _rows(c)["two-0"]
    assert row["attempt"] == 1 and row["rollout_id"] == "run1.two-0.a1" and row["failure_class"] is None
    (failure,) = [json.loads(line) for line in c.s.failures_path.read_text().splitlines()]
    assert failure["rollout_id"] == "run1.two-0" and failure["failure_class"] == "timeout"
    assert [rid for rid, _ in c.finisher.finished if rid.startswith("run1.two")] == ["run1.two-0.a1"]


async def test_terminal_failures_are_not_retried_and_attempts_run_out(tmp_path):
    h = Harness({("two", 0): HarnessOutcome.failed(FailureClass.SCHEMA, "not a Response"),
                 **{("file", a): HarnessOutcome.failed(FailureClass.NONZERO_EXIT, "exit 1") for a in range(5)}})
    c = _collector(tmp_path, h, max_attempts=2)
    await c.run()
    rows = _rows(c)
    assert rows["two-0"]["failure_class"] == "schema_error" and rows["two-0"]["attempts"] == 1
    assert rows["file-0"]["failure_class"] == "nonzero_exit" and rows["file-0"]["attempts"] == 2
    assert [k for k, *_ in h.calls].count("file") == 2 and c.finisher.finished == []


async def test_a_verifier_that_raises_is_a_terminal_failure_row(tmp_path, monkeypatch):
    (tmp_path / "badverifier.py").write_text("def check(task, text):\n    raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    tasks = _tasks(tmp_path, [{"id": "t", "prompt": "p", "answer": None,
                               "verifier": {"kind": "custom", "target": "badverifier:check"}}])
    c = _collector(tmp_path, Harness(), tasks_path=tasks)
    await c.run()
    row = _rows(c)["t-0"]
    assert row["failure_class"] == "verifier_error" and row["terminal"] is True and "boom" in row["failure_detail"]


async def test_resume_runs_a_cut_short_attempt_again_and_republishes_a_journaled_finish(tmp_path):
    first = _collector(tmp_path, Harness(), finisher=Finisher(Records(), deliver=False), record_timeout_s=0.2)
    first.journal.record_attempt("file-0", 0, "run1.file-0")  # killed while the harness ran
    first.tasks = [t for t in first.tasks if t.id == "two"]
    await first.run()  # two-0: finished, but its record never came
    assert _rows(first)["two-0"]["failure_class"] == "delivery_timeout"
    (rid, payload), = first.finisher.finished

    h = Harness()
    again = _collector(tmp_path, h)
    await again.run()
    rows = _rows(again)
    assert rows["two-0"]["failure_class"] is None and rows["two-0"]["rollout_id"] == rid
    assert dict(again.finisher.finished)[rid] == payload, "the journaled payload, published again"
    assert rows["file-0"]["rollout_id"] == "run1.file-0.a1"
    assert [(k, a) for k, a, _ in h.calls] == [("file", 1)], "a finished attempt is never run again"
    assert len(again.s.out.read_text().splitlines()) == 2, "one row per rollout after compaction"


async def test_a_finish_that_cannot_be_published_is_redone_on_resume(tmp_path):
    c = _collector(tmp_path, Harness(), finisher=Finisher(Records(), fail={"run1.two-0"}))
    await c.run()
    assert _rows(c)["two-0"]["failure_class"] == "finish_error"
    again = _collector(tmp_path, Harness())
    await again.run()
    assert _rows(again)["two-0"]["failure_class"] is None


async def test_stop_kills_nothing_durable_and_starts_nothing_new(tmp_path):
    h = Harness({("two", 0): "hang", ("file", 0): "hang"})
    c = _collector(tmp_path, h, concurrency=1)
    run = asyncio.create_task(c.run())
    while not h.calls:
        await asyncio.sleep(0.01)
    import os
    import signal

    os.kill(os.getpid(), signal.SIGINT)
    await asyncio.wait_for(run, 10)
    assert c.stopping and len(h.calls) == 1 and c.s.out.read_text() == ""
    again = _collector(tmp_path, Harness())
    await again.run()
    assert _rows(again)["two-0"]["attempt"] == 1  # the stopped attempt counts; its id is never reused
