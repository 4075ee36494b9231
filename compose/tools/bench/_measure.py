"""What the benches measure with: percentiles, a process's CPU and the machine's, from /proc."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["THREAD_PARTS", "cpu_seconds", "machine_busy", "percentile", "thread_cpu"]

THREAD_PARTS = ("main user", "main system", "librdkafka", "other threads")


def percentile(values: list[float], p: float) -> float:
    """The ``p``-th percentile of ``values`` (nearest rank, no interpolation)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def cpu_seconds(stat: str, ticks_per_s: float) -> float:
    """utime + stime of a ``/proc/<pid>/stat`` line, in seconds (the command name may hold spaces and ')')."""
    user, system = _times(stat)
    return (user + system) / ticks_per_s


def _times(stat: str) -> tuple[int, int]:
    """(utime, stime) clock ticks of a ``/proc/<pid>/stat`` line (fields 14 and 15 of proc(5), after pid and comm)."""
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])


def thread_cpu(pid: int, proc: Path = Path("/proc")) -> dict[str, float]:
    """CPU seconds of process ``pid`` by where they went: ``main user``/``main system`` (the thread running
    the event loop), ``librdkafka`` (its ``rdk:*`` threads) and ``other threads``, from ``/proc/<pid>/task``.

    A thread that ended before the reading is not counted, so the parts may sum to less than
    ``cpu_seconds`` of the process."""
    ticks = os.sysconf("SC_CLK_TCK")
    out = dict.fromkeys(THREAD_PARTS, 0.0)
    for task in (proc / str(pid) / "task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:  # ended meanwhile
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        utime, stime = _times(stat)
        user, system = utime / ticks, stime / ticks
        if task.name == str(pid):
            out["main user"] += user
            out["main system"] += system
        else:
            out["librdkafka" if comm.startswith("rdk:") else "other threads"] += user + system
    return out


def machine_busy(stat: str) -> tuple[float, float]:
    """(busy, total) clock ticks of all CPUs from the first line of ``/proc/stat`` (idle and iowait are not busy)."""
    ticks = [int(v) for v in stat.splitlines()[0].split()[1:9]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)
