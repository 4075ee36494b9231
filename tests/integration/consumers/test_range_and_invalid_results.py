"""Hostile-probe regressions on a real broker.

- ``tokentrail replay --summary --from 1d`` (docs/diagnosing.md's own form; also ``2h``, ``30m``) found
  nothing: ``--lookback`` was parsed as a bound "ago" from ``now=0.0``, which the parser took as
  "no now", so the scan started a day (plus the lookback) in the *future*. Events written now are
  found with each relative ``--from``, and an ``--until`` in the past finds none.
- A RolloutFinished whose result is not JSON stopped ``tokentrail consume`` for good (exit 3, and
  again on every restart): through the real processor and consumer it is now delivered masked
  (``invalid_result``, raw text kept) and the rollout after it is delivered too.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import time
import uuid

import pytest

from schemas.records import RolloutFinished
from tests.factories import event, finished
from tests.unit.consumers.support import child, root

pytestmark = [pytest.mark.integration, pytest.mark.real_broker]


def now_event(rollout_id: str, body):
    """An event emitted now (the factory's default time is in 2023)."""
    return dataclasses.replace(event(rollout_id, body), emitted_at=time.time_ns() // 1000)


def rollout_events(rollout_id: str, finish: RolloutFinished):
    r = root([1, 2, 3], [4, 5])
    return [now_event(rollout_id, r), now_event(rollout_id, child(r, [6], [7, 8])), now_event(rollout_id, finish)]


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "compose.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def recent(publisher, topics):
    """Three rollouts finished just now on this module's topics."""
    tag = uuid.uuid4().hex[:6]
    ids = [f"range-{tag}-{i}" for i in range(3)]
    events = [e for rid in ids for e in rollout_events(rid, finished({"reward": 1.0}))]
    publisher.publish(events)
    return ids


def summary(kafka_bootstrap, topics, *bounds: str) -> dict:
    prefix = topics.rollout_events.removesuffix("tokentrail.rollout-events")
    out = cli("replay", "--bootstrap", kafka_bootstrap, "--topic-prefix", prefix, "--summary", "--format", "json",
              *bounds)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.parametrize("since", ["1d", "2h", "30m"])
def test_a_relative_from_finds_the_rollouts_written_now(kafka_bootstrap, topics, recent, since):
    data = summary(kafka_bootstrap, topics, "--from", since)
    found = {row["rollout_id"] for row in data["timeline"]}
    assert set(recent) <= found, (since, data["rollouts"], data["events_scanned"])
    assert data["events_scanned"] >= 3 * len(recent)
    assert data["since_ms"] <= time.time() * 1000


def test_the_text_form_reports_the_rollouts(kafka_bootstrap, topics, recent):
    prefix = topics.rollout_events.removesuffix("tokentrail.rollout-events")
    out = cli("replay", "--bootstrap", kafka_bootstrap, "--topic-prefix", prefix, "--summary", "--from", "1d")
    assert out.returncode == 0, out.stderr
    first = out.stdout.splitlines()[0]
    assert not first.startswith("0 rollouts") and "rollouts finished in range" in first


def test_an_until_in_the_past_finds_none(kafka_bootstrap, topics, recent):
    data = summary(kafka_bootstrap, topics, "--until", "2020-01-01T00:00:00Z")
    assert (data["rollouts"], data["events_scanned"]) == (0, 0)
    data = summary(kafka_bootstrap, topics, "--from", "1d", "--until", "1h")  # a window that ended an hour ago
    assert not set(recent) & {row["rollout_id"] for row in data["timeline"]}


def test_an_until_in_the_future_and_a_lookback_find_them(kafka_bootstrap, topics, recent):
    data = summary(kafka_bootstrap, topics, "--from", "30m", "--until", "2099-01-01T00:00:00Z", "--lookback", "2h")
    assert set(recent) <= {row["rollout_id"] for row in data["timeline"]}


def test_a_bad_lookback_is_refused_naming_it(kafka_bootstrap, topics):
    prefix = topics.rollout_events.removesuffix("tokentrail.rollout-events")
    out = cli("replay", "--bootstrap", kafka_bootstrap, "--topic-prefix", prefix, "--summary", "--from", "1d",
              "--lookback", "yesterday")
    assert out.returncode == 2 and "--lookback 'yesterday'" in out.stderr and "2h" in out.stderr


def test_a_result_that_is_not_json_no_longer_stops_the_consumer(kafka_bootstrap, topics, publisher, processor,
                                                                  tmp_path):
    tag = uuid.uuid4().hex[:6]
    bad, good = f"badresult-{tag}", f"after-{tag}"
    publisher.publish(rollout_events(bad, RolloutFinished(result_json='{"reward": 1.0, oops'))
                      + rollout_events(good, finished({"reward": 0.5})))
    prefix = topics.rollout_events.removesuffix("tokentrail.rollout-events")
    sink = tmp_path / "rollouts.jsonl"
    wanted = {bad, good}
    records: dict[str, dict] = {}
    proc = subprocess.Popen([sys.executable, "-m", "compose.cli", "consume", "--bootstrap", kafka_bootstrap,
                             "--topic-prefix", prefix, "--group-id", f"badresult-{tag}", "--sink", "jsonl",
                             "--sink-path", str(sink), "--topic-wait", "30"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not wanted <= set(records) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
            if sink.exists():
                for line in sink.read_text().splitlines():
                    record = json.loads(line, parse_constant=lambda c: pytest.fail(f"non-JSON {c} written"))
                    records[record["rollout_id"]] = record
        alive = proc.poll() is None
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    assert alive, f"consume exited {proc.returncode}: {stderr[-2000:]}"
    assert proc.returncode == 0, stderr[-2000:]
    assert json.loads(stdout.strip().splitlines()[-1])["mask_reasons"].get("invalid_result") == 1
    assert wanted <= set(records), f"delivered: {sorted(records)}"
    broken = records[bad]
    assert broken["mask_sample"] is True and [r["code"] for r in broken["mask_reasons"]] == ["invalid_result"]
    assert broken["result"] == '{"reward": 1.0, oops' and "line 1 column" in broken["mask_reasons"][0]["detail"]
    assert records[good]["mask_sample"] is False and records[good]["result"] == {"reward": 0.5}
