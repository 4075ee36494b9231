"""The arithmetic of ``tokentrail bench e2e``: percentiles, the stage breakdown from marks, CPU from /proc."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from compose.tools.bench._measure import cpu_seconds, machine_busy, percentile, thread_cpu
from compose.tools.bench.e2e import STAGE_SPANS, cpu_per_call, finish_to_delivered, read_cpu, stage_breakdown

PATH_MARKS = ["finish.sent", "finish.record", "proc.fetched", "proc.folded", "proc.sent", "proc.snapshot_acked",
              "cons.polled", "cons.rebuilt", "cons.delivered"]


def test_percentiles_of_a_hundred_values():
    values = [float(v) for v in range(100, 0, -1)]  # any order
    assert (percentile(values, 50), percentile(values, 95), percentile(values, 99)) == (51.0, 95.0, 99.0)
    assert percentile([7.0], 99) == 7.0


def rollout(start: float, gaps: list[float], **side: float) -> dict[str, float]:
    marks, t = {}, start
    for name, gap in zip(PATH_MARKS, [0.0, *gaps]):
        t += gap
        marks[name] = t
    return {**marks, **side}


def test_the_path_stages_telescope_to_finish_to_delivered():
    assert [s[1:3] for s in STAGE_SPANS if s[3]] == list(zip(PATH_MARKS, PATH_MARKS[1:]))
    marks = {"a": rollout(100.0, [0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.007, 0.008])}
    breakdown = stage_breakdown(marks, ["a"])
    total = sum(breakdown[name][0] for name, *_rest, on_path in STAGE_SPANS if on_path)
    assert total == pytest.approx(finish_to_delivered(marks, ["a"])[0]) == pytest.approx(0.036)
    assert breakdown["fold"] == (pytest.approx(0.003), pytest.approx(0.003), 1)


def test_breakdown_percentiles_and_rollouts_missing_a_mark():
    gaps = [[0.001 * k] * 8 for k in range(1, 5)]
    marks = {f"r{k}": rollout(10.0 * k, g, **{"cons.retired": 10.0 * k + 1.0}) for k, g in enumerate(gaps)}
    del marks["r3"]["cons.retired"]  # e.g. a consumer stopped before the retire was acknowledged
    breakdown = stage_breakdown(marks, sorted(marks))
    p50, p95, n = breakdown["sink (write + fsync)"]
    assert (p50, p95, n) == (pytest.approx(0.003), pytest.approx(0.004), 4)
    retire = breakdown["retire (after delivery)"]
    assert retire[2] == 3
    unmarked = breakdown["commit (after retire)"]
    assert unmarked[2] == 0 and unmarked[0] != unmarked[0]  # NaN: no rollout had both marks


def test_cpu_seconds_from_a_stat_line_whose_command_holds_spaces_and_parens():
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ...
    stat = "4242 (python (x) y) S 1 2 3 0 -1 4194560 10 0 0 0 250 50 7 3 20 0 1 0 100 0 0"
    assert cpu_seconds(stat, 100) == pytest.approx(3.0)  # utime 250 + stime 50 ticks, not the children's 7 + 3


def test_a_process_cpu_split_by_thread_and_mode(tmp_path):
    # The interceptor bench's "by thread" line: the loop's thread (tid == pid) user and system apart,
    # librdkafka's rdk:* threads, the rest; a thread whose stat is gone by the time it is read is skipped.
    ticks = os.sysconf("SC_CLK_TCK")
    threads = {"4242": "tokentrail (x)", "4243": "rdk:main", "4244": "rdk:broker1", "4245": "python3"}
    for n, (tid, comm) in enumerate(threads.items()):
        task = tmp_path / "4242" / "task" / tid
        task.mkdir(parents=True)
        (task / "stat").write_text(f"{tid} ({comm}) S 1 2 3 0 -1 4194560 10 0 0 0 {ticks * (n + 1)} {ticks * 2} 7 3 20")
    (tmp_path / "4242" / "task" / "4246").mkdir()  # ended meanwhile: no stat
    split = thread_cpu(4242, tmp_path)
    assert split == {"main user": 1.0, "main system": 2.0, "librdkafka": (2 + 2) + (3 + 2), "other threads": 4 + 2}


def test_cpu_of_this_process_agrees_with_the_os_own_account():
    sum(i * i for i in range(300_000))  # some CPU
    own = read_cpu({"me": os.getpid()})["me"]
    times = os.times()
    assert abs(own - (times.user + times.system)) < 0.05


def test_cpu_per_call_and_the_busy_fraction():
    assert cpu_per_call({"p": 1.0, "c": 2.0}, {"p": 1.5, "c": 2.1}, 50) == {"p": pytest.approx(0.01),
                                                                       "c": pytest.approx(0.002)}
    busy, total = machine_busy("cpu  100 5 20 800 50 1 2 3 0 0\ncpu0 1 2 3 4\n")
    assert (busy, total) == (131, 981)  # idle (800) and iowait (50) are not busy
    assert machine_busy(Path("/proc/stat").read_text())[1] > 0
