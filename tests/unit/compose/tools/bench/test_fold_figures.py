"""The figures of ``tokentrail bench fold`` another tool collects: its BUDGET lines and profile summary."""

from __future__ import annotations

import re

from compose.tools.bench._pyspy import top_frames
from compose.tools.bench.budgets import budget_line, figure_line, parse

BUDGET_LINE = re.compile(r"^BUDGET (\S+) value=(-?[0-9.]+) budget=(>=|<=)([0-9.]+)"
                         r"(?: baseline=([0-9.]+) ratio=([0-9.]+))? ok=(true|false)$")


def test_budget_lines_have_the_collectable_format():
    rate = budget_line("fold.worker_events_s", 12345.6, 10_000, op=">=", baseline=15000.0)
    assert BUDGET_LINE.match(rate).groups() == ("fold.worker_events_s", "12346", ">=", "10000", "15000", "0.823",
                                                "true")
    ratio = budget_line("fold.worker_vs_pure", 0.7, 0.8, op=">=")
    assert BUDGET_LINE.match(ratio).groups() == ("fold.worker_vs_pure", "0.700", ">=", "0.8", None, None, "false")
    amp = budget_line("fold.state_write_amp", 1.074, 1.1)
    assert BUDGET_LINE.match(amp).groups()[-1] == "true"
    assert "e+" not in budget_line("x", 1_234_567.0, 10_000, op=">="), "plain numbers, never exponents"


def test_top_frames_count_own_and_inclusive_samples_by_function():
    raw = "\n".join([
        "main (a.py:1);fold (f.py:10);decode (d.py:5) 6",
        "main (a.py:1);fold (f.py:12) 3",
        "main (a.py:2);send (s.py:7) 1",
    ])
    lines = top_frames(raw, n=2)
    assert lines[0].startswith("10 samples")
    own = lines[lines.index("own time:") + 1:lines.index("inclusive (the function and what it calls):")]
    assert own == ["   60.0%  decode (d.py)", "   30.0%  fold (f.py)"]
    inclusive = lines[lines.index("inclusive (the function and what it calls):") + 1:]
    assert inclusive == ["  100.0%  main (a.py)", "   90.0%  fold (f.py)"]


def test_make_bench_collects_the_figure_and_budget_lines():
    output = "\n".join(["pure fold (dict state):", figure_line("fold.state_bytes_per_inflight_rollout", 207_872.4),
                        budget_line("fold.worker_events_s", 5_000.2, 10_000, op=">=", baseline=11_000.0)])
    rows = parse("fold", output)
    assert [(r.kind, r.name, r.fields["value"], r.ok) for r in rows] == [
        ("FIGURE", "fold.state_bytes_per_inflight_rollout", "207872", True),
        ("BUDGET", "fold.worker_events_s", "5000", False)]
    assert rows[1].fields["baseline"] == "11000" and rows[1].fields["ratio"] == "0.455"


def test_the_worker_cpu_is_not_measured_from_snapshots_read_in_one_late_burst(monkeypatch, tmp_path):
    # A reader that joined after the worker had folded everything read every snapshot within milliseconds:
    # the worker's CPU did not move between its marks, and the bench printed 0 us per event. Now NaN (n/a).
    import math

    from compose.tools.bench import _fold_worker

    cpu = iter([10.0, 10.0, 10.0])
    clock = iter([100.0, 100.001, 100.002])
    monkeypatch.setattr(_fold_worker._Watch, "_cpu", lambda self: next(cpu))
    monkeypatch.setattr(_fold_worker.time, "monotonic", lambda: next(clock))
    watch = _fold_worker._Watch(pid=1, finishes={b"a": 10, b"b": 20, b"c": 30}, profile=None)
    for key, written_ms in ((b"a", 1_000), (b"b", 1_400), (b"c", 1_800)):  # the worker wrote them over 0.8 s
        watch.snapshot(key, written_ms)
    assert math.isnan(watch.cpu_per_event()) and math.isnan(watch.busy())

    cpu, clock = iter([10.0, 10.2, 10.4]), iter([100.0, 100.4, 100.8])  # read as they were written
    watch = _fold_worker._Watch(pid=1, finishes={b"a": 10, b"b": 20, b"c": 30}, profile=None)
    for key, written_ms in ((b"a", 1_000), (b"b", 1_400), (b"c", 1_800)):
        watch.snapshot(key, written_ms)
    assert abs(watch.cpu_per_event() - 0.4 / 20) < 1e-9
