"""Policy versions at rebuild: aborted calls and their retries, version spans in the trajectory and projection."""

from __future__ import annotations

import json

import pytest

from consumers.rebuild import RebuildRules, rebuild
from consumers.rebuild.output import to_json_dict
from schemas.records import CallIncomplete, VersionSpan
from tests.unit.consumers.support import root, snapshot_of


def aborted(call_id: str) -> CallIncomplete:
    return CallIncomplete(model_call_id=call_id, reason="aborted", http_status=200, route="/v1/chat/completions",
                          detail="the engine aborted the generation")


def codes(rollout) -> list[str]:
    return [r.code for r in rollout.mask_reasons]


def test_an_aborted_call_nothing_retried_masks_aborted_by_update():
    snap = snapshot_of(aborted("a" * 32), root([1, 2], [3, 4]))
    out = rebuild(snap, RebuildRules())
    assert out.mask_sample and codes(out) == ["aborted_by_update"]
    assert out.mask_reasons[0].call_ids == ["a" * 32]


def test_an_aborted_call_whose_retry_was_captured_does_not_mask():
    snap = snapshot_of(aborted("a" * 32), root([1, 2], [3, 4], facts={"retry_of": "a" * 32}))
    out = rebuild(snap, RebuildRules())
    assert not out.mask_sample, out.mask_reasons


def test_other_incomplete_markers_still_mask_capture_incomplete():
    other = CallIncomplete(model_call_id="b" * 32, reason="upstream_error", route="/v1/chat/completions")
    snap = snapshot_of(aborted("a" * 32), other, root([1, 2], [3, 4], facts={"retry_of": "a" * 32}))
    assert codes(rebuild(snap, RebuildRules())) == ["capture_incomplete"]


def test_version_spans_are_placed_in_the_trajectory_and_the_projection():
    spans = [VersionSpan(version="v1", start=0, end=1), VersionSpan(version="v2", start=1, end=3)]
    call = root([1, 2], [3, 4, 5], facts={"version_spans": spans, "version_spans_source": "observed",
                                         "dispatch_version": "v1"})
    out = rebuild(snapshot_of(call), RebuildRules())
    assert not out.mask_sample, out.mask_reasons
    (s,) = out.trajectory.spans
    assert s.version_spans == [VersionSpan(version="v1", start=2, end=3), VersionSpan(version="v2", start=3, end=5)]
    assert (s.version_source, s.dispatch_version) == ("observed", "v1")
    record = to_json_dict(out)
    assert record["trajectory"]["spans"][0]["version_spans"] == [{"version": "v1", "start": 2, "end": 3},
                                                                {"version": "v2", "start": 3, "end": 5}]
    carrier = json.loads(out.response_json)["output"][0]
    assert carrier["generation_version_spans"] == [{"version": "v1", "start": 0, "end": 1},
                                                   {"version": "v2", "start": 1, "end": 3}]


@pytest.mark.parametrize("spans", [
    [VersionSpan(version="v1", start=0, end=2)],  # leaves a token out
    [VersionSpan(version="v1", start=1, end=3)],  # does not start at the generation
])
def test_version_spans_that_do_not_cover_the_generation_mask_the_rollout(spans):
    out = rebuild(snapshot_of(root([1, 2], [3, 4, 5], facts={"version_spans": spans})), RebuildRules())
    assert out.mask_sample and "version_spans" in str(out.mask_reasons)
