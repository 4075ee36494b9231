"""Opt-in per-rollout stage timestamps, for ``tokentrail bench e2e`` (pure: stdlib only).

Off unless the environment names a file in ``TOKENTRAIL_STAGE_LOG`` when the
process starts. Off, `STAGES.on` is False and every call site tests it before
building anything, so the hook costs one attribute read per event.

On, `StageLog.mark` appends one JSON line ``{"r": rollout id, "s": stage, "t":
unix seconds, "p": pid}`` with a single ``write`` on an ``O_APPEND`` descriptor:
lines are far below ``PIPE_BUF``, so the processor, the consumer and the
benchmark can share one file without interleaving. It is not fsynced (a
measurement aid, never a record of delivery) and a failed write turns the log
off rather than failing the process.

The stage names, in pipeline order, are `STAGES_IN_ORDER`; a process marks the
ones it sees. Kafka record timestamps a process reads (the finish event's, the
snapshot's) are marked with their own time (``t=``), so every timestamp of a
rollout lands in one place.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

__all__ = ["ENV", "STAGES", "STAGES_IN_ORDER", "StageLog", "read_stage_log"]

ENV = "TOKENTRAIL_STAGE_LOG"

# Every stage a rollout passes from the finish POST to its retire, in order, with who marks it.
STAGES_IN_ORDER: tuple[str, ...] = (
    "finish.sent",            # benchmark: just before the finish POST
    "finish.record",          # processor: the finish event's Kafka timestamp (the interceptor's produce)
    "finish.answered",        # benchmark: the finish POST answered (the event is durable)
    "proc.fetched",           # processor: the finish event reached the fold agent
    "proc.folded",            # processor: folded and written to the local table
    "proc.sent",              # processor: its changelog records and the snapshot handed to the producer
    "proc.changelog_acked",   # processor: Kafka acknowledged the last changelog record
    "proc.snapshot_acked",    # processor: Kafka acknowledged the snapshot
    "snapshot.record",        # consumer: the snapshot's Kafka timestamp
    "cons.polled",            # consumer: poll returned the snapshot
    "cons.rebuilt",           # consumer: rebuilt
    "cons.delivered",         # consumer: the sink's deliver returned (durable)
    "cons.retired",           # consumer: Kafka acknowledged the RetireRequested
    "cons.committed",         # consumer: the snapshot's offset is committed (or covered by a later commit)
)


class StageLog:
    """Appends stage marks to ``path``; with ``path`` None, ``on`` is False and `mark` does nothing."""

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.path = Path(path) if path else None
        self._fd = -1
        self.on = self.path is not None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> StageLog:
        return cls(environ.get(ENV) or None)

    def mark(self, rollout: str | bytes | None, stage: str, t: float | None = None) -> None:
        """Record that ``rollout`` reached ``stage`` at ``t`` (default: now, unix seconds)."""
        if not self.on or rollout is None:
            return
        if isinstance(rollout, bytes):
            rollout = rollout.decode("utf-8", "replace")
        line = json.dumps({"r": rollout, "s": stage, "t": time.time() if t is None else t, "p": os.getpid()})
        try:
            if self._fd < 0:
                assert self.path is not None
                self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.write(self._fd, line.encode() + b"\n")
        except OSError:
            self.on = False  # a measurement aid never stops the pipeline

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def read_stage_log(lines: Iterable[str]) -> dict[str, dict[str, float]]:
    """rollout id → stage → time of its first mark (a redelivery marks a stage again, later)."""
    out: dict[str, dict[str, float]] = {}
    for line in lines:
        if not line.strip():
            continue
        try:
            mark = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line torn by a killed process
        stages = out.setdefault(str(mark["r"]), {})
        if mark["s"] not in stages or mark["t"] < stages[mark["s"]]:
            stages[mark["s"]] = float(mark["t"])
    return out


# The one log of this process, read from the environment once at import.
STAGES = StageLog.from_env()
