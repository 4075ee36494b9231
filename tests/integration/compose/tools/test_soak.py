"""The soak, short (``make soak`` runs it for an hour): waves of 8 rollouts for 24 s on the run's own broker,
a fault every 6 s (a processor kill -9, a consumer kill between deliver and retire, an engine stall and an
engine abort mid-generation; the broker and interceptor kills are the hour's, and `make chaos`'s), a new
policy version every 12 s, a sample every 6 s.

Every acknowledged call delivered exactly once, every record equal to its version's baseline, the load
drained back to the state held before it (``compose.tools.soak.run.SoakReport.verdict``); and the run really did what it says: each fault
happened, versions were announced, samples were taken, retired rollouts' headers counted apart.
"""

from __future__ import annotations

import csv

import pytest

from compose.tools.soak.cli import render, write_csv
from compose.tools.soak.run import JUDGED, SoakConfig, run_soak

pytestmark = [pytest.mark.integration, pytest.mark.real_broker]


def test_a_short_soak_with_faults_and_announcements_loses_nothing_and_drains(tmp_path):
    # No process lives a judged minute here (SoakConfig.reference_s): memory growth is the hour's to judge.
    config = SoakConfig(run_dir=tmp_path / "soak", minutes=24 / 60, rollouts=8, fault_every_s=6,
                        announce_every_s=12, sample_every_s=6, processor_kills=1,
                        faults=("processor", "consumer", "engine-stall", "engine-abort"))
    report = run_soak(config, log=lambda line: None)
    table = render(report, config)
    print("\n" + table)
    assert report.verdict(config) == [], table
    faults = {row.fault.split()[0] for row in report.rows}
    assert {"(b)", "(c)", "(e)", "(f)"} <= faults, table  # each fault ran at least once
    hit = {label: sum(row.fault_hit for row in report.rows if row.fault.startswith(label)) for label in ("(e)", "(f)")}
    # A stall shorter than every timeout fails no call; an abort lands on a generation in flight.
    assert hit["(e)"] == 0 and hit["(f)"] >= 1, (hit, table)
    assert len(report.announced) >= 2 and len(report.samples) >= 4, table  # v0, then at least one more
    assert report.delivered == sum(row.rollouts for row in report.rows) and report.drained_s >= 0, table
    assert set(JUDGED) <= set(report.samples[0].processes), table
    assert report.tombstones[0] == report.delivered  # every rollout retired, its header kept apart from the state
    write_csv(report, tmp_path / "soak.csv")
    assert len(list(csv.DictReader((tmp_path / "soak.csv").open()))) == len(report.samples)
