"""What the benches measure with: percentiles, a process's CPU and the machine's, from /proc."""

from __future__ import annotations

__all__ = ["cpu_seconds", "machine_busy", "percentile"]


def percentile(values: list[float], p: float) -> float:
    """The ``p``-th percentile of ``values`` (nearest rank, no interpolation)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def cpu_seconds(stat: str, ticks_per_s: float) -> float:
    """utime + stime of a ``/proc/<pid>/stat`` line, in seconds (the command name may hold spaces and ')')."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / ticks_per_s  # fields 14 and 15 of proc(5), after pid and comm


def machine_busy(stat: str) -> tuple[float, float]:
    """(busy, total) clock ticks of all CPUs from the first line of ``/proc/stat`` (idle and iowait are not busy)."""
    ticks = [int(v) for v in stat.splitlines()[0].split()[1:9]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)
