"""Replay and diagnosis, without a broker: bounds, folding logged records, the explanation,
rule changes, the batch summary and its HTML report."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from consumers.rebuild import RebuildRules, rebuild
from consumers.replay.eventlog import LoggedEvent
from consumers.replay.explain import explain
from consumers.replay.report_html import render_html
from consumers.replay.rollouts import Bound, fold_records, parse_bound, rule_changes
from consumers.replay.summary import harness_of, summarize
from schemas.codec import encode_event
from schemas.errors import ConfigError
from schemas.records import ParentResolution
from tests.factories import event, finished, incomplete, make_call

TOOLS = {"tools_present": True, "user_agent": "claude-cli/2.1.332 (external, sdk-cli)"}


def logged(rollout_id, bodies, start=0, partition=0, t0=1_700_000_000_000):
    return [LoggedEvent(partition, start + i, t0 + i * 1000, encode_event(event(rollout_id, b)), rollout_id.encode())
            for i, b in enumerate(bodies)]


def broken_rollout(rid="r-broken"):
    c1 = make_call([1, 2, 3], [10, 11], continuation_fingerprint="f1", facts=TOOLS)
    c2 = make_call([1, 2, 3, 10, 11, 4], [12], request_fingerprint="f1", resolution=ParentResolution.UNRESOLVED,
                   facts=TOOLS)
    lost = incomplete("7" * 32, "upstream_error")
    return logged(rid, [c1, c2, lost, finished({"reward": 0.0})]), c1, c2


def test_bounds_parse_times_durations_and_offsets():
    assert parse_bound("offset:42") == Bound(offset=42)
    assert parse_bound("2026-11-30T01:00:00Z").time_ms == 1796000400000
    assert parse_bound("1700000000").time_ms == 1_700_000_000_000
    assert parse_bound("2h", now=10_000.0).time_ms == (10_000 - 7200) * 1000
    with pytest.raises(ConfigError, match="ISO time"):
        parse_bound("yesterday-ish")


def test_replay_explains_the_failed_call_and_the_reason():
    records, c1, c2 = broken_rollout()
    result = fold_records("r-broken", records, RebuildRules())
    assert result.rollout.mask_sample and len(result.snapshots) == 1
    text = explain(result)
    assert "rollout r-broken: MASKED" in text
    assert "call 77777777: upstream_error HTTP 500" in text  # the failed call and the reason
    assert "capture_incomplete: upstream_error [calls 77777777]" in text
    assert f"{c2.model_call_id[:8]}  resolved_by_processor" in text  # how the link was decided
    assert text.count("[delivered]") == 2


def test_until_stops_before_the_freeze():
    records, _, _ = broken_rollout()
    result = fold_records("r-broken", records, RebuildRules(), until=Bound(offset=3))
    assert result.rollout is None and "NOT FINISHED" in explain(result)


def side_chain_rollout(rid="r-side"):
    # A long, tool-less title call first (not a side call under the default 64-token
    # threshold), then the task, answered in one call: two single-call conversations and
    # no evidence of which one answered the harness.
    title = make_call([90, 91], list(range(100, 200)), facts={"tools_present": False}, text="A title")
    main = make_call([1, 2], [3, 4], facts=TOOLS, text="done")
    return logged(rid, [title, main, finished({"reward": 1.0})])


def test_a_rule_that_classifies_the_side_chain_makes_the_rollout_deliverable():
    records = side_chain_rollout()
    default = fold_records("r-side", records, RebuildRules())
    assert default.rollout.mask_sample, "two unattributable roots must mask by default"
    assert [r.code for r in default.rollout.mask_reasons] == ["terminal_ambiguous"]
    relaxed = rebuild(default.snapshot, RebuildRules(toolless_max_tokens=200))
    assert not relaxed.mask_sample and relaxed.metrics.side_calls_excluded == 1
    changes = rule_changes(default.rollout, relaxed)
    assert "mask_sample true -> false" in changes and "side_calls_excluded 0 -> 1" in changes


class FakeLog:
    def __init__(self, partitions):
        self._partitions = partitions

    def partitions(self):
        return len(self._partitions)

    def partition_events(self, partition, *, from_time_ms=None):
        yield from (r for r in self._partitions[partition] if from_time_ms is None or r.timestamp_ms >= from_time_ms)


def test_summary_counts_reasons_harnesses_models_and_renders_html():
    broken, _, _ = broken_rollout("r-a")
    clean = logged("r-b", [make_call([5, 6], [7], facts=TOOLS), finished()], start=10)
    side = side_chain_rollout("r-c")
    data = summarize(FakeLog([broken + clean, side]), since_ms=None, until_ms=None).to_dict()
    assert (data["rollouts"], data["masked"]) == (3, 2)
    assert data["by_reason"]["capture_incomplete"] == 1
    assert data["by_harness"]["claude-cli"]["rollouts"] == 3
    assert data["top_masked"][0]["rollout_id"] == "r-c"  # the costliest masked rollout first
    page = render_html(data)
    HTMLParser().feed(page)
    assert "<svg" in page and "capture_incomplete" in page


def test_summary_range_uses_the_freeze_time():
    broken, _, _ = broken_rollout("r-old")
    data = summarize(FakeLog([broken]), since_ms=broken[-1].timestamp_ms + 10_000, until_ms=None).to_dict()
    assert data["rollouts"] == 0


def test_harness_is_the_user_agent_product_without_version():
    assert harness_of("claude-cli/2.1.332 (external, sdk-cli)") == "claude-cli"
    assert harness_of("AsyncOpenAI/Python 3.57.0") == "AsyncOpenAI"
    assert harness_of("") == "unknown"
