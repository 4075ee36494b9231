"""The pure fold: lineage verification, idempotency, lifecycle (dict state, no framework)."""

from __future__ import annotations

import dataclasses

from processors.fold import fold, fold_raw, snapshot_id_for
from processors.replay import MemoryState, replay
from schemas.codec import decode_snapshot, encode_event, encode_snapshot
from schemas.records import ParentResolution
from tests.factories import event, finished, hashed, incomplete, make_call, retire

R = "rollout-1"


def run(events, state=None):
    state = MemoryState() if state is None else state
    snapshots, results = [], []
    for step in replay(((ev.rollout_id.encode(), encode_event(ev)) for ev in events), state=state):
        snapshots.extend(step.snapshots)
        results.append(step.result)
    return state, snapshots, results


def three_turns():
    c1 = make_call([1, 2, 3], [10, 11], call_id="a" * 32)
    c2 = make_call([1, 2, 3, 10, 11, 4, 5], [12], call_id="b" * 32, parent=c1.model_call_id,
                   request_fingerprint=hashed("fp1"), parent_digest=c1.digest)
    c1 = dataclasses.replace(c1, continuation_fingerprint=hashed("fp1"))
    c2 = dataclasses.replace(c2, continuation_fingerprint=hashed("fp2"))
    c3 = make_call([1, 2, 3, 10, 11, 4, 5, 12, 6], [13, 14], call_id="c" * 32, request_fingerprint=hashed("fp2"),
                   resolution=ParentResolution.UNRESOLVED)
    return c1, c2, c3


def test_fold_verifies_claims_resolves_cold_calls_and_stores_deltas():
    c1, c2, c3 = three_turns()
    _, snaps, _ = run([event(R, c1), event(R, c2), event(R, c3), event(R, finished())])
    (snap,) = snaps
    calls = {sc.call.model_call_id: sc for sc in snap.calls}
    assert calls[c1.model_call_id].lineage_note == "root"
    assert calls[c2.model_call_id].lineage_note == "verified"
    assert calls[c2.model_call_id].call.prompt_token_ids == [4, 5]
    assert calls[c3.model_call_id].lineage_note == "resolved_by_processor"
    assert calls[c3.model_call_id].call.parent_call_id == c2.model_call_id
    assert calls[c3.model_call_id].call.prompt_token_ids == [6]
    assert snap.version == 4 and snap.snapshot_id == snapshot_id_for(R, 4)
    assert not snap.incomplete


def test_an_unresolved_call_without_a_fingerprint_is_never_promoted_to_root():
    # Self-contradictory evidence (UNRESOLVED, yet no model-authored history): fail closed.
    odd = make_call([1, 2, 3], [10], call_id="d" * 32, resolution=ParentResolution.UNRESOLVED)
    root = make_call([1, 2, 3], [10], call_id="e" * 32)
    _, (snap,), _ = run([event(R, odd), event(R, root), event(R, finished())])
    calls = {sc.call.model_call_id: sc for sc in snap.calls}
    assert calls[odd.model_call_id].call.parent_resolution is ParentResolution.UNRESOLVED
    assert calls[odd.model_call_id].lineage_note.startswith("unresolved:")
    assert calls[root.model_call_id].call.parent_resolution is ParentResolution.ROOT


def test_duplicates_change_nothing_and_give_the_same_snapshot_bytes():
    c1, c2, c3 = three_turns()
    evs = [event(R, c1), event(R, c2), event(R, c3), event(R, finished())]
    clean_state, (clean,), _ = run(evs)
    dup_state, dup_snaps, _ = run([evs[0], evs[0], evs[1], evs[0], evs[2], evs[1], evs[3], evs[3]])
    assert encode_snapshot(dup_snaps[0]) == encode_snapshot(clean)
    assert all(encode_snapshot(s) == encode_snapshot(clean) for s in dup_snaps)
    assert dup_state == clean_state
    # same call re-sent under a new event id is a duplicate too
    again = dataclasses.replace(evs[1], event_id="another")
    _, _, (res,) = run([again], dup_state)
    assert not res.changed


def test_conflicting_payload_marks_incomplete():
    c1, _, _ = three_turns()
    bad = dataclasses.replace(c1, generation_log_probs=[-9.0, -9.0])
    _, (snap,), _ = run([event(R, c1), event(R, bad), event(R, finished())])
    assert snap.incomplete and snap.conflicting_call_ids == [c1.model_call_id]
    assert snap.incomplete_markers[0].reason == "conflicting_payload"


def test_refinishing_unchanged_emits_nothing_and_late_write_bumps_version():
    c1, c2, _ = three_turns()
    state, snaps, (_, _, again) = run([event(R, c1), event(R, finished()), event(R, finished())])
    assert len(snaps) == 1 and not again.changed  # one record per attempt (issue 25)
    v = snaps[0].version
    state, _, (late_res,) = run([event(R, c2)], state)
    assert late_res.changed
    state, snaps2, _ = run([event(R, finished())], state)
    assert snaps2[0].version == v + 2 and snaps2[0].snapshot_id != snaps[0].snapshot_id
    assert snaps2[0].late_writes == 1 and snaps2[0].calls[-1].late


def test_retire_only_exact_snapshot_and_tombstone_reports_late_writers():
    c1, c2, _ = three_turns()
    state, (snap,), _ = run([event(R, c1), event(R, finished())])
    state, _, (stale,) = run([event(R, retire(snap.snapshot_id, snap.version + 1))], state)
    assert not stale.changed and "stale retire" in stale.notes[0]
    state, _, (ok,) = run([event(R, retire(snap.snapshot_id, snap.version))], state)
    assert ok.changed
    assert [k for k in state if not k.startswith(b"h\x00")] == []  # bodies gone, tombstone stays
    state, _, (late,) = run([event(R, c2)], state)
    assert late.deadletters and late.deadletters[0].reason == "write_after_retire"


def test_incomplete_counts_after_freeze_and_dedupes_by_event_id():
    c1, _, _ = three_turns()
    inc = event(R, incomplete("x" * 32))
    state, _, _ = run([event(R, c1), event(R, finished()), inc, inc])
    _, (snap,), _ = run([event(R, finished())], state)
    assert snap.incomplete and len(snap.incomplete_markers) == 1


def test_undecodable_and_mis_keyed_records_become_dead_letters():
    res = fold_raw({}, b"r", b"garbage")
    # Fail closed: the rollout it is keyed to gets an invalid_event marker (tests/unit/processors/test_refused_events.py).
    assert res.deadletters[0].reason == "CodecError" and set(res.writes) == {b"i\x00r\x00\x00\x00\x00\x00", b"h\x00r"}
    c1, _, _ = three_turns()
    res = fold_raw({}, b"other-rollout", encode_event(event(R, c1)))
    assert "differs from rollout_id" in res.deadletters[0].detail


def test_header_is_written_last_and_a_half_applied_event_is_redone():
    c1, c2, _ = three_turns()
    state, _, _ = run([event(R, c1)])
    res = fold(state, event(R, c2))
    keys = list(res.writes)
    assert keys[-1].startswith(b"h\x00")
    # crash: bodies written, header not
    for k in keys[:-1]:
        state[k] = res.writes[k]
    state, (snap,), _ = run([event(R, c2), event(R, finished())], state)
    assert [sc.call.model_call_id for sc in snap.calls] == [c1.model_call_id, c2.model_call_id]
    assert decode_snapshot(encode_snapshot(snap)) == snap
