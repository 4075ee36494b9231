"""An interceptor call's CallStarted intent, folded with what the call left: a capture clears it, a
CallIncomplete settles it (the snapshot carries that marker once, not a second intent marker), nothing at
all masks the rollout (``intent_without_capture``). A rollout finished while its call is in flight is masked."""

from __future__ import annotations

from processors.replay import MemoryState, replay
from processors.snapshot import INTENT_WITHOUT_CAPTURE
from schemas.codec import encode_event
from tests.factories import event, finished, incomplete, make_call, started

R = "rollout-intent"


def _snapshot(*bodies):
    state = MemoryState()
    snaps = [s for step in replay(((R.encode(), encode_event(event(R, b))) for b in bodies), state=state)
             for s in step.snapshots]
    return snaps[-1]


def test_a_captured_call_with_its_intent_is_deliverable():
    call = make_call([1, 2], [3], call_id="a" * 32)
    snap = _snapshot(started(call.model_call_id), call, finished())
    assert not snap.incomplete and [c.call.model_call_id for c in snap.calls] == [call.model_call_id]


def test_a_call_in_flight_when_the_rollout_finishes_masks_it():
    call = make_call([1, 2], [3], call_id="a" * 32)
    snap = _snapshot(started(call.model_call_id), finished())
    assert snap.incomplete
    assert [(m.model_call_id, m.reason) for m in snap.incomplete_markers] == [(call.model_call_id,
                                                                               INTENT_WITHOUT_CAPTURE)]
    assert "still in flight" in snap.incomplete_markers[0].detail


def test_an_incomplete_call_settles_its_intent_with_its_own_reason():
    call_id = "b" * 32
    snap = _snapshot(started(call_id), incomplete(call_id, "engine_timeout"), finished())
    assert snap.incomplete
    assert [(m.model_call_id, m.reason) for m in snap.incomplete_markers] == [(call_id, "engine_timeout")]


def test_a_marker_of_another_call_does_not_settle_an_intent():
    snap = _snapshot(started("c" * 32), incomplete("d" * 32), finished())
    assert sorted(m.reason for m in snap.incomplete_markers) == [INTENT_WITHOUT_CAPTURE, "upstream_error"]
