"""The replay summary's policy-staleness histogram: each rollout judged against the version current at its freeze."""

from __future__ import annotations

from consumers.replay.eventlog import LoggedEvent
from consumers.replay.summary import VersionHistory, render_text, summarize
from schemas.codec import encode_event
from schemas.policy_versions import PolicyVersion
from schemas.records import VersionSpan
from tests.factories import event, finished, make_call
from tests.unit.consumers.replay.test_replay import FakeLog

T0 = 1_700_000_000  # seconds; tests.factories' events are stamped from T0 (microseconds)
ANNOUNCED = [PolicyVersion(label="v0", step=0), *(PolicyVersion(label=f"v{s}", step=s, announced_at=T0 + 10 * s)
                                                  for s in (1, 2, 3))]


def rollout(rid: str, version: str, finish_after_s: int, offset: int) -> list[LoggedEvent]:
    call = make_call([1, 2], [3, 4], facts={"version_spans": [VersionSpan(version=version, start=0, end=2)],
                                            "version_spans_source": "observed", "tools_present": True})
    at_us = finish_after_s * 1_000_000
    events = [event(rid, call, at=at_us - 1), event(rid, finished({"reward": 1.0}), at=at_us)]
    return [LoggedEvent(0, offset + i, T0 * 1000 + finish_after_s * 1000, encode_event(e), rid.encode())
            for i, e in enumerate(events)]


def log() -> FakeLog:
    return FakeLog([rollout("r-a", "v0", 5, 0) + rollout("r-b", "v0", 25, 2) + rollout("r-c", "v2", 35, 4)
                    + rollout("r-d", "mystery", 36, 6)])


def test_the_summary_histograms_staleness_at_freeze_and_masks_beyond_max_staleness():
    data = summarize(log(), since_ms=None, until_ms=None, announcements=ANNOUNCED, max_staleness=1).to_dict()
    assert data["staleness"] == {"rollouts_judged": 4, "histogram": {"0": 1, "1": 1, "2": 1}, "unknown": 1,
                                 "max_staleness": 1, "stale": 1}
    assert data["by_reason"] == {"stale_policy": 1, "unknown_policy_version": 1}
    by_id = {r["rollout_id"]: r["reasons"] for r in data["timeline"]}
    assert by_id == {"r-a": [], "r-b": ["stale_policy"], "r-c": [], "r-d": ["unknown_policy_version"]}
    text = render_text(data)
    assert "policy staleness at freeze" in text and "1 beyond max_staleness=1" in text


def test_without_a_bound_staleness_is_reported_and_nothing_masked():
    data = summarize(log(), since_ms=None, until_ms=None, announcements=ANNOUNCED).to_dict()
    assert data["masked"] == 0 and data["staleness"]["histogram"] == {"0": 1, "1": 1, "2": 1}
    assert data["staleness"]["stale"] == 0


def test_without_announcements_there_is_no_staleness_key():
    data = summarize(log(), since_ms=None, until_ms=None).to_dict()
    assert "staleness" not in data and data["masked"] == 0


def test_the_history_knows_only_what_was_announced_by_then():
    history = VersionHistory(ANNOUNCED)
    assert history.at(T0 + 15).current_label == "v1"
    assert history.at(T0 + 15).step_of("v3") is None  # not announced yet
    assert history.at(T0 + 99).current_label == "v3"
    assert history.at(0).current_label == "v0"  # announced without a time: from the start
