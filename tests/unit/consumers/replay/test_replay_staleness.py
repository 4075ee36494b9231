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


def test_the_html_report_tables_staleness_only_when_judged():
    from consumers.replay.report_html import render_html

    page = render_html(summarize(log(), since_ms=None, until_ms=None, announcements=ANNOUNCED,
                                 max_staleness=1).to_dict())
    assert "Policy staleness at freeze" in page and "1 beyond max_staleness=1" in page
    assert "<tr><td>2</td><td>1</td></tr>" in page  # one rollout two versions behind
    assert "Policy staleness" not in render_html(summarize(log(), since_ms=None, until_ms=None).to_dict())


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


class _RolloutLog(FakeLog):
    """A FakeLog that also serves one rollout's records, as EventLog.rollout_events does."""

    def rollout_events(self, rollout_id, *, from_offset=None, from_time_ms=None):
        return [r for p in self._partitions for r in p if r.key == rollout_id.encode()]

    def close(self):
        pass


def _replay_rollout(monkeypatch, capsys, *argv: str) -> tuple[int, str]:
    import argparse

    from consumers.replay import cli, eventlog

    monkeypatch.setattr(eventlog, "EventLog", lambda bootstrap, topic, security=None: _RolloutLog(log()._partitions))
    monkeypatch.setattr(cli, "read_announcements", lambda bootstrap, topic, required, security=None: ANNOUNCED)
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    rc = cli.main(parser.parse_args(["--bootstrap", "127.0.0.1:9", *argv]))
    return rc, capsys.readouterr().out


def test_a_replayed_rollout_shows_its_version_spans_and_staleness_at_freeze(monkeypatch, capsys):
    rc, out = _replay_rollout(monkeypatch, capsys, "--rollout", "r-b")
    assert rc == 0 and "DELIVERABLE" in out
    assert "v0[2:4) (observed)" in out  # the call's generation (after its 2 prompt tokens), in trajectory positions
    # r-b froze at T0+25, when v2 was current: two versions behind.
    assert "policy staleness at freeze: 2 version(s) behind (oldest 'v0', current 'v2')" in out


def test_max_staleness_masks_a_replayed_rollout_as_the_consumer_would(monkeypatch, capsys):
    rc, out = _replay_rollout(monkeypatch, capsys, "--rollout", "r-b", "--rollout", "r-d", "--max-staleness", "1",
                              "--format", "json")
    assert rc == 0
    import json

    docs = {d["rollout_id"]: d["rebuilt"] for d in json.loads(out)}
    assert [r["code"] for r in docs["r-b"]["mask_reasons"]] == ["stale_policy"]
    assert docs["r-b"]["_ng_token_capture"]["policy_staleness"] == 2
    assert [r["code"] for r in docs["r-d"]["mask_reasons"]] == ["unknown_policy_version"]


def test_a_rule_file_is_compared_under_the_same_staleness_bound(monkeypatch, capsys, tmp_path):
    rules = tmp_path / "rules.json"
    rules.write_text("{}")  # the default rules: nothing to change
    rc, out = _replay_rollout(monkeypatch, capsys, "--rollout", "r-b", "--max-staleness", "1", "--rules", str(rules),
                              "--format", "json")
    assert rc == 0
    import json

    (doc,) = json.loads(out)
    assert [r["code"] for r in doc["rebuilt"]["mask_reasons"]] == ["stale_policy"]
    assert doc["changes_under_rules"] == []  # the stale mask stands under both: not a rule change
