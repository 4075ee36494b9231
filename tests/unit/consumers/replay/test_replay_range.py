"""Time ranges of ``tokentrail replay --summary`` (hostile-probe regression, no broker).

``--summary --from 1d`` found nothing: ``--lookback`` was parsed with ``parse_bound(..., now=0.0)``,
and ``now or time.time()`` took the epoch for "no now", so the lookback came out as minus (now - 1h)
and the scan started about a day and a half in the future. The real-broker form of this test is
``tests/integration/consumers/test_range_and_invalid_results.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import pytest

import consumers.replay.eventlog
from consumers.replay import cli as replay_cli
from consumers.replay.eventlog import LoggedEvent
from consumers.replay.rollouts import parse_bound, parse_duration
from schemas.codec import encode_event
from schemas.errors import ConfigError
from schemas.kafka.topics import key_for
from tests.factories import event, finished
from tests.unit.consumers.support import child, root


def test_a_relative_bound_at_now_zero_is_relative_to_the_epoch():
    assert parse_bound("2h", now=0.0).time_ms == -7_200_000
    assert parse_bound("30m", now=0.0).time_ms == -1_800_000


def test_a_relative_bound_without_now_is_relative_to_the_clock():
    before = time.time() * 1000
    got = parse_bound("1d").time_ms
    assert before - 86_400_000 - 1000 <= got <= time.time() * 1000 - 86_400_000 + 1000


@pytest.mark.parametrize("text, seconds", [("1h", 3600), ("90m", 5400), ("1d", 86400), ("45s", 45), ("1.5h", 5400),
                                           ("0", 0), ("120", 120)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["yesterday", "-1h", "2026-01-01T00:00:00Z", "nan", "inf", ""])
def test_a_bad_duration_names_the_option_the_value_and_the_fix(text):
    with pytest.raises(ConfigError, match=r"--lookback .*use a duration such as 30m, 2h, 1d"):
        parse_duration(text, name="--lookback")


class FakeLog:
    """An EventLog over records in memory: ``from_time_ms`` selects like Kafka's offsets-for-times."""

    instances: list[FakeLog] = []

    def __init__(self, records: list[LoggedEvent]) -> None:
        self.records = records
        self.asked: list[int | None] = []
        FakeLog.instances.append(self)

    def partitions(self) -> int:
        return 1

    def partition_events(self, partition: int, *, from_time_ms: int | None = None):
        self.asked.append(from_time_ms)
        for n, record in enumerate(self.records):
            if from_time_ms is None or record.timestamp_ms >= from_time_ms:
                yield from self.records[n:]
                return

    def close(self) -> None:
        pass


@pytest.fixture
def logged_now(monkeypatch):
    now_us = time.time_ns() // 1000
    records = []
    for i in range(3):
        rid = f"now-{i}"
        r = root([1, 2], [3])
        for body in (r, child(r, [4], [5]), finished({"reward": 1.0})):
            ev = dataclasses.replace(event(rid, body), emitted_at=now_us)
            records.append(LoggedEvent(0, len(records), now_us // 1000, encode_event(ev), key_for(rid)))
    monkeypatch.setattr(consumers.replay.eventlog, "EventLog", lambda *a, **k: FakeLog(records))
    # No broker here: the policy-versions topic holds no announcement (else each run waits out the follower).
    monkeypatch.setattr(replay_cli, "read_announcements", lambda bootstrap, topic, required, security=None: [])
    FakeLog.instances.clear()
    return records


def run_summary(capsys, *argv: str) -> dict:
    parser = argparse.ArgumentParser()
    replay_cli.configure(parser)
    args = parser.parse_args(["--bootstrap", "x:1", "--summary", "--format", "json", *argv])
    assert replay_cli.main(args) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("since", ["1d", "2h", "30m"])
def test_summary_from_a_duration_ago_finds_what_was_written_now(logged_now, capsys, since):
    data = run_summary(capsys, "--from", since)
    assert (data["rollouts"], data["events_scanned"]) == (3, 9)
    (asked,) = FakeLog.instances[0].asked
    assert asked == data["since_ms"] - 3_600_000  # the default lookback, 1h before --from, not in the future


def test_summary_lookback_is_a_duration(logged_now, capsys):
    data = run_summary(capsys, "--from", "30m", "--lookback", "2h")
    assert FakeLog.instances[0].asked == [data["since_ms"] - 7_200_000] and data["rollouts"] == 3


def test_summary_until_in_the_past_finds_none(logged_now, capsys):
    data = run_summary(capsys, "--until", "2020-01-01T00:00:00Z")
    assert (data["rollouts"], data["events_scanned"]) == (0, 0)


def test_summary_rejects_a_bad_lookback(logged_now, capsys):
    parser = argparse.ArgumentParser()
    replay_cli.configure(parser)
    args = parser.parse_args(["--bootstrap", "x:1", "--summary", "--from", "1d", "--lookback", "soon"])
    assert replay_cli.main(args) == 2
    assert "--lookback 'soon'" in capsys.readouterr().err
