"""A TrainerSink plugin that crashes its consumer between deliver and retire, for chaos runs.

``KillingSink`` wraps the built-in JSONL sink: ``deliver`` writes (and fsyncs) through it,
and right after the *k*-th new delivery returned, for each *k* in the plan, it SIGKILLs
its own process. The plan is a JSON list of delivery counts in ``plan_path``, read after
every new delivery, so the chaos runner can arm kills while the consumer runs (no file:
no kills). The consumer commits its offset and publishes RetireRequested only after
``deliver`` returns to it, so the kill lands exactly in the window between "the trainer has
it" and "the processor may forget it": the restarted consumer must deliver that snapshot
again (the JSONL sink drops it as already there) and then retire it.

The count of new deliveries survives the kill in ``count_path`` (written and fsynced
before the kill), so a restarted consumer does not kill itself again at the same count.
Loaded by ``tokentrail consume --sink compose.tools.chaos.killsink:KillingSink --sink-kwargs
'{"path": ..., "count_path": ..., "plan_path": ...}'``.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from consumers.sinks.plugin import JsonlSink
from schemas.errors import ConfigError
from schemas.records import RebuiltRollout

TARGET = "compose.tools.chaos.killsink:KillingSink"

__all__ = ["TARGET", "KillingSink", "read_count", "read_plan", "write_count", "write_plan"]


class KillingSink:
    """The JSONL sink, plus SIGKILL of this process after the chosen delivery counts."""

    def __init__(self, path: str, count_path: str, plan_path: str, include_response: bool = True) -> None:
        self._inner = JsonlSink(path, include_response=include_response)
        self.include_response = include_response
        self._count_path = Path(count_path)
        self._plan_path = Path(plan_path)
        self._count = _read_count(self._count_path)
        read_plan(self._plan_path)  # a malformed plan fails at startup, naming the file

    async def deliver(self, rollout: RebuiltRollout) -> None:
        before = self._inner.path.stat().st_size if self._inner.path.exists() else 0
        await self._inner.deliver(rollout)
        if self._inner.path.stat().st_size == before:
            return  # a redelivery the JSONL sink already had: not a new delivery
        self._count += 1
        write_count(self._count_path, self._count)
        if self._count in read_plan(self._plan_path):
            os.kill(os.getpid(), signal.SIGKILL)  # deliver returned durable; offset commit and retire never happen

    async def close(self) -> None:
        await self._inner.close()


def _read_count(path: Path) -> int:
    try:
        return int(path.read_text().strip() or 0)
    except FileNotFoundError:
        return 0
    except ValueError as exc:
        raise ConfigError(f"KillingSink count_path {path} does not hold a delivery count: {exc}") from exc


def read_count(path: Path) -> int:
    """New deliveries made so far by every KillingSink sharing ``path``."""
    return _read_count(path)


def read_plan(path: Path) -> frozenset[int]:
    try:
        plan = json.loads(path.read_text())
    except FileNotFoundError:
        return frozenset()
    except ValueError as exc:
        raise ConfigError(f"KillingSink plan {path} is not JSON: {exc}; write a list of delivery counts") from exc
    if not isinstance(plan, list) or any(not isinstance(k, int) or isinstance(k, bool) or k < 1 for k in plan):
        raise ConfigError(f"KillingSink plan {path} = {plan!r}: must be a list of delivery counts >= 1, e.g. [3, 9]")
    return frozenset(plan)


def write_plan(path: Path, counts: list[int]) -> None:
    """Arm kills after these (absolute) delivery counts."""
    _atomic_write(path, json.dumps(sorted(counts)))


def write_count(path: Path, count: int) -> None:
    _atomic_write(path, str(count))


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
