"""The soak's verdict: the chaos counts, RSS growth per service instance, the drain; its table and CSV."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from compose.tools.chaos.accounting import Row
from compose.tools.chaos.workload import ChaosError
from compose.tools.soak.cli import render, write_csv
from compose.tools.soak.run import SoakConfig, SoakReport
from compose.tools.soak.sampling import ProcessStats, Sample, percentile


def _config(**kw) -> SoakConfig:
    return SoakConfig(run_dir=Path("/tmp/unused"), minutes=60, **kw)


def _sample(at_min: float, rss: dict[str, tuple[int, int]]) -> Sample:
    return Sample(at_s=at_min * 60, processes={n: ProcessStats(pid=pid, rss_kib=kib, fds=10, threads=4)
                                               for n, (pid, kib) in rss.items()})


def _report(*samples: Sample, rows=(), drained_s: float = 1.0) -> SoakReport:
    return SoakReport(rows=list(rows) or [Row("steady", rollouts=8, acked=24)], samples=list(samples),
                      drained_s=drained_s)


def test_a_clean_soak_passes_and_each_count_fails_it_by_name():
    flat = [_sample(m, {"interceptor": (1, 80_000), "processor": (2, 90_000)}) for m in (5, 10, 30, 60)]
    assert _report(*flat).verdict(_config()) == []
    for count in ("lost", "duplicated", "unmasked_lost", "differs"):
        row = Row("(a) broker kill -9, restart", rollouts=8, acked=24, **{count: 1})
        assert _report(*flat, rows=[row]).verdict(_config()) == [f"(a) broker kill -9, restart: {count} 1"]


def test_rss_growth_is_judged_from_minute_10_of_each_instance_and_never_for_the_stand_in_engine():
    warmup = _sample(5, {"interceptor": (1, 50_000), "policy": (9, 100_000)})  # before the reference: ignored
    ref = _sample(10, {"interceptor": (1, 80_000), "policy": (9, 100_000)})
    grown = _sample(60, {"interceptor": (1, 88_001), "policy": (9, 300_000)})
    assert _report(warmup, ref, grown).rss_growth(300) == pytest.approx({"interceptor": 88_001 / 80_000 - 1})
    assert _report(_sample(0, {"interceptor": (1, 70_000)}), warmup, ref, grown).verdict(_config()) == [
        "interceptor RSS grew 10.0% from 10.0 min to the end (> 10%)"]
    within = _sample(60, {"interceptor": (1, 88_000)})
    assert _report(_sample(0, {"interceptor": (1, 70_000)}), ref, within).rss_growth(600) == pytest.approx(
        {"interceptor": 0.1})
    assert _report(_sample(0, {"interceptor": (1, 70_000)}), ref, within).verdict(_config()) == []


def test_a_restarted_service_is_judged_per_instance_and_a_short_life_not_at_all():
    first = [_sample(m, {"processor": (1, 80_000 + 1_000 * m)}) for m in (0, 10, 20)]  # +11 % from its minute 10
    second = [_sample(m, {"processor": (2, 90_000)}) for m in (21, 31, 41, 50)]  # flat
    third = [_sample(m, {"processor": (3, 500_000)}) for m in (55, 60)]  # lived 5 minutes: not judged
    growth = _report(*first, *second, *third).rss_growth(600)
    assert growth == pytest.approx({"processor": 100_000 / 90_000 - 1})  # the first, from its minute 10
    assert _report(*second, *third).rss_growth(600) == {"processor": 0.0}
    assert _report(*third).rss_growth(600) == {}


def test_a_rollout_delivered_again_after_its_wave_was_accounted_fails_it():
    report = _report(_sample(10, {}))
    report.late_duplicates = ["soak-w3-1", "soak-w3-1"]
    assert report.verdict(_config()) == ["2 record(s) delivered again after their wave was accounted: ['soak-w3-1']"]


def test_a_load_that_did_not_drain_fails_and_says_what_was_left():
    report = _report(_sample(10, {}), drained_s=-1.0)
    report.state_after, report.state_before = (12, 4096), (0, 0)
    (line,) = report.verdict(_config(drain_timeout_s=30))
    assert "did not drain within 30 s" in line and "(12, 4096)" in line


def test_the_reference_minute_is_10_for_an_hour_half_way_for_a_short_run_and_never_under_one():
    assert _config().reference_s == 600
    assert SoakConfig(run_dir=Path("/x"), minutes=3).reference_s == 90
    assert SoakConfig(run_dir=Path("/x"), minutes=0.5).reference_s == 60


@pytest.mark.parametrize(("field", "value", "needle"), [
    ("faults", ("kernel",), "faults=kernel: unknown"), ("minutes", 0, "minutes=0"),
    ("fault_every_s", -1, "fault_every_s=-1"), ("rollouts", 0, "rollouts=0"), ("processor_kills", 0, "processor_kills=0")])
def test_bad_settings_name_the_field_before_anything_runs(field, value, needle):
    with pytest.raises(ChaosError, match=needle):
        SoakConfig(run_dir=Path("/x"), **{field: value})


def test_percentile_is_by_nearest_rank():
    assert percentile([], 0.5) == 0.0
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 0.99) == 99.0
    assert percentile([5.0], 0.99) == 5.0


def test_the_table_and_the_csv_hold_every_sample(tmp_path):
    report = _report(_sample(10, {"interceptor": (1, 80_000)}), _sample(20, {"interceptor": (1, 81_000)}))
    report.tombstones, report.delivered = (10, 1060), 10
    table = render(report, _config())
    assert "retired headers 10 / 1060 B, 106 B per retired rollout" in table and "verdict: PASS" in table
    write_csv(report, tmp_path / "soak.csv")
    rows = list(csv.DictReader((tmp_path / "soak.csv").open()))
    assert [r["interceptor_rss_kib"] for r in rows] == ["80000", "81000"]


def test_the_soaks_interceptor_books_are_small_enough_to_be_full_before_the_reference_sample(tmp_path):
    import argparse

    from compose.tools.chaos.run import ChaosConfig, chaos_stack
    from producers import cli as intercept_cli

    config = SoakConfig(run_dir=tmp_path)
    stack = chaos_stack(ChaosConfig(run_dir=tmp_path, interceptor_rollouts=config.interceptor_rollouts), "b:9092", "t")
    args = list(stack.intercept_args)
    assert args[args.index("--index-max-rollouts") + 1] == args[args.index("--finished-max-rollouts") + 1] == "1000"
    # ~400 rollouts a minute fill a book of 1,000 well before the reference sample
    assert config.interceptor_rollouts <= 400 * config.reference_s / 60 / 2
    parser = argparse.ArgumentParser()
    intercept_cli.configure(parser)
    parsed = parser.parse_args(["--upstream", "http://e", "--bootstrap", "b:9092", *args])
    assert (parsed.index_max_rollouts, parsed.finished_max_rollouts) == (1000, 1000)
    # chaos itself keeps the interceptor's defaults
    assert "--index-max-rollouts" not in chaos_stack(ChaosConfig(run_dir=tmp_path), "b:9092", "t").intercept_args
