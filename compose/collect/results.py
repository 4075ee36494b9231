"""Result rows: one per (task, sample) in ``--out``, one per failed attempt in the failures file.

A row is what a trainer or a person reads about one rollout: its task, sample and GRPO
group, the reward and the verifier's output, ``mask_sample`` and its reasons and the
``_ng_token_capture`` metrics of the rebuilt record, and the path of the record's JSON
(its trajectory). A failure row has the same keys, reward 0.0, ``mask_sample`` true
(it is never training data) and ``failure_class``.

``ResultsFile`` appends rows durably (``fsync``); on resume ``compact`` rewrites the file
atomically (temporary file, ``fsync``, rename) with the rows that stand, dropping the
failure rows of rollouts the run will try again, so a finished run's file holds exactly
one row per rollout.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from compose.collect.journal import append_line
from compose.collect.outcome import Failure
from schemas.errors import ConfigError

__all__ = ["ResultsFile", "success_row", "failure_row"]


def _base(*, run_id: str, key: str, task_id: str, sample: int, group_id: str, attempt: int, rollout_id: str,
          harness: str, wall_s: float) -> dict[str, Any]:
    return {"run_id": run_id, "key": key, "task_id": task_id, "sample": sample, "group_id": group_id,
            "attempt": attempt, "rollout_id": rollout_id, "harness": harness, "wall_s": round(wall_s, 3)}


def success_row(*, record: dict[str, Any] | None, reward: float, verdict: dict[str, Any], final_text: str | None,
                trajectory_path: str | None, **ids: Any) -> dict[str, Any]:
    """The row of a verified, finished rollout; ``record`` is its rebuilt record (None: not waited for)."""
    row = _base(**ids)
    row.update({
        "reward": reward, "verifier": verdict, "final_text": final_text,
        "mask_sample": None if record is None else record["mask_sample"],
        "mask_reasons": [] if record is None else record["mask_reasons"],
        "_ng_token_capture": None if record is None else record.get("_ng_token_capture"),
        "trajectory_path": trajectory_path, "failure_class": None,
    })
    return row


def failure_row(failure: Failure, *, attempts: int, final_text: str | None = None, **ids: Any) -> dict[str, Any]:
    """A reward-0 sentinel row: never training data (``mask_sample`` true, the class as its reason)."""
    row = _base(**ids)
    row.update({
        "reward": 0.0, "verifier": None, "final_text": final_text, "mask_sample": True,
        "mask_reasons": [{"code": str(failure.failure_class), "detail": failure.detail}],
        "_ng_token_capture": None, "trajectory_path": None,
        "failure_class": str(failure.failure_class), "failure_detail": failure.detail,
        "terminal": failure.terminal, "attempts": attempts,
    })
    return row


class ResultsFile:
    """The results JSONL of a run: the standing row of each rollout, by key."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows: dict[str, dict[str, Any]] = {}
        if path.exists():
            for row in _rows(path):
                self.rows[row["key"]] = row  # a later row of a key stands

    def append(self, row: dict[str, Any]) -> None:
        append_line(self.path, row)
        self.rows[row["key"]] = row

    def compact(self, retry: Iterable[str]) -> None:
        """Rewrite the file atomically without the rows of ``retry`` (and without superseded rows)."""
        for key in retry:
            self.rows.pop(key, None)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as f:
            for row in self.rows.values():
                f.write((json.dumps(row, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n").encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


def _rows(path: Path) -> list[dict[str, Any]]:
    data = path.read_bytes()
    lines = data.split(b"\n")
    out = []
    for n, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            if n == len(lines) - 1:
                break  # torn last line of a killed run: its rollout is redone from the journal
            raise ConfigError(f"{path}:{n + 1} is not JSON: fix or remove the line (it is a result row)") from None
        if isinstance(row, dict) and isinstance(row.get("key"), str):
            out.append(row)
    return out
