"""The run journal: what a collect run started, finished and lost, durable before it acts.

One JSON object per line beside the results file (``<out>.journal.jsonl``), each
``fsync``ed before the collector goes on, so a run killed at any point (``kill -9``
included) is resumed exactly by the same command:

* ``run`` (first line): the run id and what defines the run (harness, samples, the task
  file's digest). A re-run with other values is refused: its rollouts would not be the
  same rollouts.
* ``attempt``: written before a harness starts; names the attempt's own rollout id
  (``rollout_ids``), so the captures of an attempt that was cut short are never mixed
  into the next attempt's rollout.
* ``finish``: the whole RolloutFinished payload, written *before* it is published. On
  resume an attempt with a ``finish`` but no result row publishes that same payload
  again: the processor re-freezes an unchanged rollout with the same payload to the same
  snapshot identity, so a finish is delivered once whether or not the first publish
  landed, and a finished attempt is never run again.
* ``failure``: an attempt that ended without a rewarded rollout, with its class.

A torn last line (the process died mid-write) is ignored; any other unreadable line is a
``JournalError`` naming the file and the line: a damaged journal is never guessed at.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schemas.errors import ConfigError

__all__ = ["Journal", "JournalError", "AttemptEntry", "RunHeader", "rollout_ids", "job_key", "now_ms", "append_line"]


class JournalError(ConfigError):
    """The journal cannot be read, or belongs to another run."""


@dataclass(frozen=True)
class RunHeader:
    run_id: str
    harness: str
    samples: int
    tasks_digest: str
    started_ms: int  # rebuilt records of the run are read from here on


@dataclass
class AttemptEntry:
    attempt: int
    rollout_id: str
    finish: dict[str, Any] | None = None   # the RolloutFinished payload, once decided
    failure: dict[str, Any] | None = None  # {"failure_class", "detail", "terminal"}


def job_key(task_id: str, sample: int) -> str:
    return f"{task_id}-{sample}"


def rollout_ids(run_id: str, task_id: str, sample: int, attempt: int, *, declared: str | None = None,
                samples: int = 1) -> str:
    """The rollout id of one attempt: ``<run>.<task>-<sample>``, ``.a<k>`` appended for attempt k >= 1.

    A task's declared ``_ng_rollout_id`` replaces ``<run>.<task>`` (and stands alone when the
    task has one sample), so a caller's ids are honoured; retries still get their suffix.
    """
    if declared is not None:
        base = declared if samples == 1 else f"{declared}-{sample}"
    else:
        base = f"{run_id}.{task_id}-{sample}"
    return base if attempt == 0 else f"{base}.a{attempt}"


@dataclass
class Journal:
    path: Path
    header: RunHeader
    entries: dict[str, list[AttemptEntry]] = field(default_factory=lambda: defaultdict(list))

    @classmethod
    def open(cls, path: Path, fresh: RunHeader) -> Journal:
        """The journal at ``path``, created with ``fresh`` as its header when absent.

        JournalError when it exists with another harness, sample count or task digest.
        """
        if not path.exists() or path.stat().st_size == 0:
            path.parent.mkdir(parents=True, exist_ok=True)
            journal = cls(path, fresh)
            journal._append({"type": "run", **fresh.__dict__})
            return journal
        lines = _read_lines(path)
        if not lines or lines[0].get("type") != "run":
            raise JournalError(f"{path}:1 is not a run header: the file is not a tokentrail collect journal; "
                               "use another --out or remove it")
        head = lines[0]
        header = RunHeader(**{k: head[k] for k in RunHeader.__dataclass_fields__})
        for name in ("harness", "samples", "tasks_digest"):
            if getattr(header, name) != getattr(fresh, name):
                raise JournalError(
                    f"{path} belongs to run {header.run_id!r} with {name}={getattr(header, name)!r}, not "
                    f"{getattr(fresh, name)!r}: re-run with the same options to resume it, or use another --out")
        if fresh.run_id != header.run_id and fresh.run_id:
            raise JournalError(f"{path} belongs to run {header.run_id!r}, not {fresh.run_id!r}: drop --run-id to "
                               "resume it, or use another --out")
        journal = cls(path, header)
        for n, line in enumerate(lines[1:], start=2):
            journal._apply(line, n)
        return journal

    # -- what happened --------------------------------------------------------------------
    def attempts(self, key: str) -> list[AttemptEntry]:
        return self.entries.get(key, [])

    # -- recording (durable before return) -------------------------------------------------
    def record_attempt(self, key: str, attempt: int, rollout_id: str) -> None:
        self._append({"type": "attempt", "key": key, "attempt": attempt, "rollout_id": rollout_id})
        self.entries[key].append(AttemptEntry(attempt, rollout_id))

    def record_finish(self, key: str, attempt: int, payload: dict[str, Any]) -> None:
        self._append({"type": "finish", "key": key, "attempt": attempt, "payload": payload})
        self._entry(key, attempt).finish = payload

    def record_failure(self, key: str, attempt: int, failure: dict[str, Any]) -> None:
        self._append({"type": "failure", "key": key, "attempt": attempt, **failure})
        self._entry(key, attempt).failure = failure

    # -- internals -----------------------------------------------------------------------
    def _entry(self, key: str, attempt: int) -> AttemptEntry:
        for entry in self.entries.get(key, []):
            if entry.attempt == attempt:
                return entry
        raise JournalError(f"{self.path}: attempt {attempt} of {key!r} was never started")

    def _apply(self, line: dict[str, Any], n: int) -> None:
        kind = line.get("type")
        try:
            if kind == "attempt":
                self.entries[line["key"]].append(AttemptEntry(line["attempt"], line["rollout_id"]))
            elif kind == "finish":
                self._entry(line["key"], line["attempt"]).finish = line["payload"]
            elif kind == "failure":
                self._entry(line["key"], line["attempt"]).failure = {
                    k: line[k] for k in ("failure_class", "detail", "terminal")}
            else:
                raise KeyError("type")
        except (KeyError, TypeError) as exc:
            raise JournalError(f"{self.path}:{n}: unreadable {kind!r} entry (missing {exc}); the journal is "
                               "damaged: restore it or use another --out") from None

    def _append(self, record: dict[str, Any]) -> None:
        append_line(self.path, record)


def append_line(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON line and ``fsync`` it: durable when this returns (the journal's and the rows' write)."""
    data = (json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_lines(path: Path) -> list[dict[str, Any]]:
    raw = path.read_bytes().split(b"\n")
    out: list[dict[str, Any]] = []
    last = len(raw) - 1
    for n, chunk in enumerate(raw):
        if not chunk.strip():
            continue
        try:
            value = json.loads(chunk)
        except ValueError:
            if n >= last - 1 and not path.read_bytes().endswith(b"\n"):
                break  # the torn last line of a run killed mid-write: that entry never counted
            raise JournalError(f"{path}:{n + 1} is not JSON: the journal is damaged; restore it or use "
                               "another --out") from None
        if not isinstance(value, dict):
            raise JournalError(f"{path}:{n + 1} is not a JSON object: the journal is damaged")
        out.append(value)
    return out


def now_ms() -> int:
    return int(time.time() * 1000)
