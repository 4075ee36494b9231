"""The fold's lifecycle under at-least-once delivery, bad input and large rollouts (dict state)."""

from __future__ import annotations

import dataclasses

import pytest

from processors.fold import StateReadError, fold_raw, snapshot_id_for
from processors.replay import MemoryState, replay
from processors.snapshot import INTENT_WITHOUT_CAPTURE, MAX_SNAPSHOT_BYTES, SNAPSHOT_TOO_LARGE, build_snapshot
from processors.state import call_key, header_codec, header_key
from schemas.codec import decode_snapshot, encode_event, encode_snapshot
from schemas.records import ParentResolution
from tests.factories import event, finished, hashed, incomplete, make_call, retire, started
from tests.unit.processors.scenarios import realistic_rollout

R = "rollout-life"


class Log:
    """A partition: events get consecutive offsets, and any of them can be delivered again."""

    def __init__(self, state: MemoryState | None = None) -> None:
        self.records: list[bytes] = []
        self.state = MemoryState() if state is None else state

    def publish(self, *events) -> list:
        results = []
        for ev in events:
            self.records.append(encode_event(ev))
            results.append(self.deliver(len(self.records) - 1))
        return results

    def deliver(self, offset: int):
        (step,) = replay([(R.encode(), self.records[offset])], state=self.state, offsets_from=offset)
        return step.result


def chain(n: int):
    calls, prev = [], None
    for i in range(n):
        prompt = (prev.cum if prev else []) + [100 + i, 200 + i]
        call = make_call(prompt, [300 + i], continuation_fingerprint=hashed(f"fp{i}"),
                         request_fingerprint=hashed(f"fp{i - 1}") if prev else "",
                         **({"parent": prev.call.model_call_id, "delta_of": prev.cum,
                             "parent_digest": prev.call.digest} if prev else {}))
        prev = type("N", (), {"call": call, "cum": prompt + [300 + i]})
        calls.append(call)
    return calls


def test_redelivery_after_retirement_changes_nothing_and_reports_nothing():
    log = Log()
    c1, c2 = chain(2)
    *_, fin = log.publish(event(R, c1), event(R, c2), event(R, finished()))
    (snap,) = fin.snapshots
    (ret,) = log.publish(event(R, retire(snap.snapshot_id, snap.version)))
    assert ret.changed
    tombstone = dict(log.state)
    for offset in range(len(log.records)):  # a crash before the commit: everything comes again
        res = log.deliver(offset)
        assert not res.changed and not res.deadletters and not res.emitted, offset
    assert log.state == tombstone


def test_a_late_writer_after_retirement_is_reported_once_and_its_redelivery_only_repeats_the_report():
    log = Log()
    c1, c2 = chain(2)
    (fin,) = log.publish(event(R, c1), event(R, finished()))[1:]
    log.publish(event(R, retire(fin.snapshots[0].snapshot_id, fin.snapshots[0].version)))
    (late,) = log.publish(event(R, c2))
    assert [d.reason for d in late.deadletters] == ["write_after_retire"]
    assert header_codec().decode(log.state[header_key(R)]).writes_after_retire == 1
    again = log.deliver(len(log.records) - 1)
    assert [d.reason for d in again.deadletters] == ["write_after_retire"] and not again.changed
    assert header_codec().decode(log.state[header_key(R)]).writes_after_retire == 1


def test_a_redelivered_finish_re_emits_its_snapshot_only_while_it_is_the_last_change():
    log = Log()
    c1, c2 = chain(2)
    (_, fin) = log.publish(event(R, c1), event(R, finished()))
    assert log.deliver(1).emitted == fin.emitted  # crash before the snapshot was acknowledged
    log.publish(event(R, c2))  # a late write: the snapshot was acknowledged before it was taken
    assert not log.deliver(1).emitted


def test_refinishing_with_the_same_payload_emits_nothing_a_new_payload_is_dead_lettered():
    # One record per rollout attempt (issue 25; tests/unit/processors/test_finish_once.py): the first
    # freeze's snapshot may already be delivered, so a later finish never mints a second record.
    log = Log()
    (c1,) = chain(1)
    _, first = log.publish(event(R, c1), event(R, finished({"reward": 1})))
    (snap,) = first.snapshots
    assert snap.snapshot_id == snapshot_id_for(R, snap.version)
    (same,) = log.publish(event(R, finished({"reward": 1})))
    assert not same.emitted and not same.changed and not same.deadletters
    (other,) = log.publish(event(R, finished({"reward": 0})))
    assert not other.emitted and [d.reason for d in other.deadletters] == ["conflicting_finish"]
    assert header_codec().decode(log.state[header_key(R)]).version == snap.version  # the record out there stands


def test_incomplete_after_freeze_counts_and_a_republished_marker_changes_nothing():
    log = Log()
    (c1,) = chain(1)
    _, fin = log.publish(event(R, c1), event(R, finished()))
    marker = incomplete("x" * 32)
    (late,) = log.publish(event(R, marker, event_id="e-inc"))
    assert late.changed
    (copy,) = log.publish(event(R, marker, event_id="e-inc-again"))
    assert not copy.changed
    (stale,) = log.publish(event(R, retire(fin.snapshots[0].snapshot_id, fin.snapshots[0].version)))
    assert not stale.changed and "stale retire" in stale.notes[0]
    (refrozen,) = log.publish(event(R, finished()))  # the same finish again: late evidence re-freezes
    (snap,) = refrozen.snapshots
    assert snap.incomplete and len(snap.incomplete_markers) == 1 and snap.late_writes == 1


def test_conflicting_payload_is_marked_once_even_when_republished():
    log = Log()
    (c1,) = chain(1)
    bad = dataclasses.replace(c1, generation_log_probs=[-9.0])
    log.publish(event(R, c1), event(R, bad), event(R, bad))
    (fin,) = log.publish(event(R, finished()))
    (snap,) = fin.snapshots
    assert snap.conflicting_call_ids == [c1.model_call_id] and len(snap.incomplete_markers) == 1
    assert snap.calls[0].call.generation_log_probs == c1.generation_log_probs  # the first payload is kept


def test_forks_stay_a_tree_identical_retries_collapse_different_candidates_are_ambiguous():
    log = Log()
    root = make_call([1, 2], [3], continuation_fingerprint=hashed("fp-root"))
    kids = [make_call([1, 2, 3, 4 + i], [9], request_fingerprint=hashed("fp-root"), continuation_fingerprint=hashed("fp-kid"),
                      resolution=ParentResolution.UNRESOLVED) for i in range(2)]
    twin = dataclasses.replace(kids[0], model_call_id="f" * 32)  # identical tokens, same fingerprint
    grandchild = make_call([1, 2, 3, 4, 9, 7], [8], request_fingerprint=hashed("fp-kid"),
                           resolution=ParentResolution.UNRESOLVED)
    log.publish(*(event(R, c) for c in (root, kids[0], kids[1], twin, grandchild)), event(R, finished()))
    snap = decode_snapshot(build_snapshot(log.state, header_codec().decode(log.state[header_key(R)])).data)
    calls = {sc.call.model_call_id: sc.call for sc in snap.calls}
    assert calls[kids[0].model_call_id].parent_call_id == calls[kids[1].model_call_id].parent_call_id == \
        root.model_call_id  # a fork: two children of one call
    # kids[1] has the same fingerprint but other tokens, so it never verifies for the grandchild;
    # kids[0] and its twin verify with identical tokens: interchangeable, the smallest id wins.
    assert calls[grandchild.model_call_id].parent_call_id == min(kids[0].model_call_id, twin.model_call_id)
    odd = make_call([1, 2, 3, 4, 9, 5], [6], continuation_fingerprint=hashed("fp-root"),
                    request_fingerprint=hashed("fp-root"), resolution=ParentResolution.UNRESOLVED)
    after_odd = make_call([1, 2, 3, 4, 9, 5, 6, 1], [2], request_fingerprint=hashed("fp-root"),
                          resolution=ParentResolution.UNRESOLVED)
    log.publish(event(R, odd), event(R, after_odd))
    (fin,) = log.publish(event(R, finished()))
    last = {sc.call.model_call_id: sc for sc in fin.snapshots[0].calls}[after_odd.model_call_id]
    assert last.call.parent_resolution is ParentResolution.UNRESOLVED
    assert last.call.parent_resolution_reason == "ambiguous" and last.lineage_note.startswith("ambiguous:")


def test_bad_events_become_dead_letters_with_their_reason():
    ev = event(R, retire("s", 1))
    newer = encode_event(dataclasses.replace(ev, schema_version=2))
    res = fold_raw({}, R.encode(), newer)
    assert [d.reason for d in res.deadletters] == ["SchemaVersionError"] and "upgrade" in res.deadletters[0].detail
    unknown = bytearray(encode_event(ev))
    unknown[2:10] = b"\x07" * 8
    assert fold_raw({}, R.encode(), bytes(unknown)).deadletters[0].reason == "SchemaVersionError"
    bad_id = encode_event(dataclasses.replace(ev, rollout_id="no spaces allowed"))
    assert fold_raw({}, None, bad_id).deadletters[0].reason == "ContractError"
    assert fold_raw({}, R.encode(), encode_event(ev)[:-3]).deadletters[0].reason == "CodecError"


def test_an_event_the_fold_cannot_apply_is_parked_but_a_failing_store_stops_the_worker():
    (c1,) = chain(1)
    state = {header_key(R): b"\xc3\x01garbage"}
    res = fold_raw(state, R.encode(), encode_event(event(R, c1)))
    assert [d.reason for d in res.deadletters] == ["FoldError"] and not res.changed

    class Broken:
        def get(self, key):
            raise OSError("disk on fire")

    with pytest.raises(StateReadError, match="disk on fire"):
        fold_raw(Broken(), R.encode(), encode_event(event(R, c1)))


def test_a_snapshot_over_the_topic_limit_is_emitted_masked_with_its_identity():
    log = Log()
    calls = chain(3)
    log.publish(*(event(R, c) for c in calls), event(R, incomplete("y" * 32)), event(R, finished()))
    header = header_codec().decode(log.state[header_key(R)])
    full = build_snapshot(log.state, header)
    small = build_snapshot(log.state, header, limit=len(full.data) - 1)
    snap = decode_snapshot(small.data)
    assert (small.snapshot_id, small.version) == (full.snapshot_id, full.version)
    assert snap.calls == [] and snap.incomplete
    assert [m.reason for m in snap.incomplete_markers] == ["upstream_error", SNAPSHOT_TOO_LARGE]
    assert str(len(full.data)) in snap.incomplete_markers[-1].detail


@pytest.mark.parametrize("cold", [False, True], ids=["deltas", "cold-full-prompts"])
def test_a_200_call_128k_token_rollout_snapshot_fits_the_topic_and_writes_stay_per_event(cold):
    calls = realistic_rollout(200, 128 * 1024, cold=cold)
    log = Log()
    ratios = []
    for call in calls:
        (res,) = log.publish(event(R, call))
        written = sum(len(k) + len(v or b"") for k, v in res.writes.items())
        ratios.append(written / len(log.records[-1]))
    (fin,) = log.publish(event(R, finished()))
    (snap,) = fin.emitted
    assert len(snap.data) <= MAX_SNAPSHOT_BYTES
    decoded = snap.decode()
    assert len(decoded.calls) == 200 and not decoded.incomplete
    assert encode_snapshot(decoded) == snap.data
    assert all(sc.call.prompt_is_delta for sc in decoded.calls[1:]), "every prompt is stored once, as a delta"
    assert sum(len(sc.call.prompt_token_ids) + len(sc.call.generation_token_ids) for sc in decoded.calls) == \
        calls[-1].cum_len
    # Per-event state writes follow the event, not the rollout: the same at call 2 and call 200.
    stored = [len(log.state[call_key(R, c.model_call_id)]) for c in calls]
    assert max(stored[1:]) - min(stored[1:]) < 64
    if not cold:
        assert max(ratios) <= 1.5


def test_an_intent_without_a_capture_makes_the_snapshot_incomplete_and_a_capture_clears_it():
    log = Log()
    c1, c2 = chain(2)
    (fin,) = log.publish(event(R, started(c1.model_call_id)), event(R, c1), event(R, started(c2.model_call_id)),
                         event(R, finished()))[3:]
    (snap,) = fin.snapshots
    assert snap.incomplete
    assert [(m.model_call_id, m.reason) for m in snap.incomplete_markers] == [(c2.model_call_id,
                                                                               INTENT_WITHOUT_CAPTURE)]
    (late,) = log.publish(event(R, c2))  # the capture arrives after the freeze: late, but it satisfies the intent
    assert late.changed
    (refrozen,) = log.publish(event(R, finished()))  # the same finish again
    (snap2,) = refrozen.snapshots
    assert not snap2.incomplete and snap2.version > snap.version and snap2.late_writes == 1


def test_intents_are_idempotent_and_an_intent_for_a_captured_call_changes_nothing():
    log = Log()
    (c1,) = chain(1)
    log.publish(event(R, started(c1.model_call_id)))
    before = dict(log.state)
    (dup,) = log.publish(event(R, started(c1.model_call_id)))  # same intent, new event id
    assert not dup.changed and log.state == before
    log.publish(event(R, c1))
    (after,) = log.publish(event(R, started(c1.model_call_id)))
    assert not after.changed
    (fin,) = log.publish(event(R, finished()))
    assert not fin.snapshots[0].incomplete and header_codec().decode(log.state[header_key(R)]).n_started == 1


def test_an_intent_cut_short_before_its_header_is_redone_and_retirement_sweeps_intents():
    log = Log()
    (c1,) = chain(1)
    log.publish(event(R, c1))
    log.records.append(encode_event(event(R, started("lost-call"))))
    res = fold_raw(log.state, R.encode(), log.records[-1], position=(0, len(log.records) - 1))
    partial = MemoryState(log.state)
    for key, value in res.writes.items():  # a crash after the bodies, before the header (the commit point)
        if key != header_key(R):
            partial[key] = value
    log.state = partial
    log.deliver(len(log.records) - 1)  # redelivered: redone, not taken for a duplicate
    (fin,) = log.publish(event(R, finished()))
    (snap,) = fin.snapshots
    assert [m.reason for m in snap.incomplete_markers] == [INTENT_WITHOUT_CAPTURE]
    log.publish(event(R, retire(snap.snapshot_id, snap.version)))
    assert list(log.state) == [header_key(R)], "retirement leaves only the tombstone"
