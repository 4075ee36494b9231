"""Refused records (issue 15, items 5 and 13): dead-lettered with the reason, fail closed, nothing else harmed.

- Item 5: an event with bytes after its Avro body was folded, its call body stored with those bytes
  and spliced into the snapshot, which no reader could decode (the rollout was never delivered).
- Item 13: a model_call_id outside ``schemas.ids.CALL_ID_RULE`` was folded into state keys.

A refused record keyed to a rollout marks that rollout incomplete (``invalid_event``): what it
carried is lost. Good events of the same rollout, and other rollouts, are unharmed.
"""

from __future__ import annotations

import dataclasses

import pytest

from processors.fold import fold_raw
from processors.replay import MemoryState, replay
from processors.state import header_key
from schemas.codec import decode_snapshot, encode_event, encode_snapshot
from schemas.records import CallIncomplete, IncompleteReason
from tests.factories import event, finished, incomplete, make_call, retire, started

R, OTHER = "rollout-refused", "rollout-bystander"


def rec(ev) -> tuple[bytes, bytes]:
    return ev.rollout_id.encode(), encode_event(ev)


def trailing(ev, extra: bytes = b"\x00\x00\x07") -> tuple[bytes, bytes]:
    return ev.rollout_id.encode(), encode_event(ev) + extra


def fold_all(records, state=None, **kw):
    state = MemoryState() if state is None else state
    return state, list(replay(records, state=state, **kw))


def last_snapshot(steps):
    (data,) = [e.data for s in steps for e in s.result.emitted][-1:]
    return data


def test_a_capture_with_trailing_bytes_is_dead_lettered_and_the_rollout_still_gets_a_decodable_snapshot():
    good, spoiled = make_call([1, 2], [3, 4]), make_call([5, 6], [7])
    records = [rec(event(R, good)), trailing(event(R, spoiled, event_id="ev-spoiled")), rec(event(R, finished()))]
    state, steps = fold_all(records)
    (dead,) = steps[1].result.deadletters
    assert dead.reason == "CodecError" and dead.rollout_id == R
    assert "'ev-spoiled' has 3 byte(s) after its Avro body" in dead.detail
    assert "publish each record alone" in dead.detail
    snap = decode_snapshot(last_snapshot(steps))  # undecodable before: the stored body carried the 3 bytes
    assert [sc.call for sc in snap.calls] == [good]  # the good call is unharmed
    (marker,) = snap.incomplete_markers
    assert snap.incomplete and marker.reason == IncompleteReason.INVALID_EVENT and marker.model_call_id is None
    assert "CodecError" in marker.detail and "after its Avro body" in marker.detail
    assert all(spoiled.model_call_id.encode() not in k for k in state)  # nothing of it reached the state


@pytest.mark.parametrize("extra", [b"\x00", b"\x00\x00\x07", encode_event(event(R, retire("s", 1)))], ids=len)
@pytest.mark.parametrize("body", [make_call([1], [2]), incomplete("c" * 32), finished(), started("d" * 32),
                                  retire("s", 1)], ids=lambda b: type(b).__name__)
def test_every_event_type_with_trailing_bytes_is_refused(body, extra):
    res = fold_raw({}, R.encode(), encode_event(event(R, body)) + extra)
    assert [d.reason for d in res.deadletters] == ["CodecError"]
    assert f"has {len(extra)} byte(s) after its Avro body" in res.deadletters[0].detail
    assert not res.emitted


BAD_IDS = ["", "a/b", "a\x00b", "line\nbreak", "x" * 201, " call-1", "ü"]


def _with_call_id(body, call_id):
    return dataclasses.replace(body, model_call_id=call_id)


@pytest.mark.parametrize("call_id", BAD_IDS, ids=lambda c: repr(c) if len(c) < 20 else f"{len(c)}-chars")
@pytest.mark.parametrize("body", [make_call([1], [2]), started("d" * 32), incomplete("c" * 32)],
                         ids=lambda b: type(b).__name__)
def test_a_malformed_model_call_id_is_dead_lettered_naming_the_field_the_value_and_the_rule(body, call_id):
    state, (step,) = fold_all([rec(event(R, _with_call_id(body, call_id)))])
    (dead,) = step.result.deadletters
    assert dead.reason == "ContractError" and dead.rollout_id == R
    assert f"invalid {type(body).__name__}.model_call_id {repr(call_id)[:40]}" in dead.detail
    assert "^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$" in dead.detail
    # Only the header and the marker: no key holds the bad id.
    assert all(k.startswith((b"h\x00", b"i\x00")) for k in state)
    assert state.header(R).n_incomplete == 1 and state.header(R).n_calls == 0 and state.header(R).n_started == 0


@pytest.mark.parametrize("call_id", ["call-1", "call-lost", "0123456789abcdef0123456789abcdef", "a"])
def test_the_ids_gym_and_our_producers_mint_fold_as_before(call_id):
    records = [rec(event(R, make_call([1], [2], call_id=call_id))), rec(event(R, started(call_id))),
               rec(event(R, incomplete(call_id))), rec(event(R, CallIncomplete(reason="upstream_error"))),
               rec(event(R, finished()))]
    _, steps = fold_all(records)
    assert not [d for s in steps for d in s.result.deadletters]
    snap = decode_snapshot(last_snapshot(steps))
    assert [sc.call.model_call_id for sc in snap.calls] == [call_id]
    assert [m.reason for m in snap.incomplete_markers] == ["upstream_error", "upstream_error"]


def test_bad_events_interleaved_with_good_ones_leave_the_good_calls_and_other_rollouts_unharmed():
    c1, c2 = make_call([1, 2], [3]), make_call([4], [5])
    o1 = make_call([9], [8])
    bad_id = make_call([6], [7], call_id="call/3")
    good = [rec(event(R, c1)), rec(event(OTHER, o1)), rec(event(R, c2)), rec(event(OTHER, finished())),
            rec(event(R, finished()))]
    bad = [trailing(event(R, make_call([1], [1]))), rec(event(R, bad_id))]
    mixed = [good[0], bad[0], good[1], good[2], bad[1], good[3], good[4]]
    clean_state, clean_steps = fold_all(good)
    state, steps = fold_all(mixed)
    assert [d.reason for s in steps for d in s.result.deadletters] == ["CodecError", "ContractError"]
    # The bystander's state and snapshot are byte-identical to the clean run's.
    assert {k: v for k, v in state.items() if OTHER.encode() in k} == {
        k: v for k, v in clean_state.items() if OTHER.encode() in k}
    by_rollout = lambda ss: {e.rollout_id: e.data for s in ss for e in s.result.emitted}  # noqa: E731
    assert by_rollout(steps)[OTHER] == by_rollout(clean_steps)[OTHER]
    snap, clean = decode_snapshot(by_rollout(steps)[R]), decode_snapshot(by_rollout(clean_steps)[R])
    assert snap.calls == clean.calls and not clean.incomplete
    assert [m.reason for m in snap.incomplete_markers] == [IncompleteReason.INVALID_EVENT] * 2
    # Live (with Kafka positions) and replay give the same snapshot bytes.
    _, live = fold_all(mixed, offsets_from=100)
    assert by_rollout(live) == by_rollout(steps)


def test_a_refused_record_marks_its_rollout_once_however_often_it_is_delivered_or_republished():
    spoiled = trailing(event(R, make_call([1], [2])))
    state, steps = fold_all([spoiled, spoiled, rec(event(R, finished()))])
    assert [len(s.result.deadletters) for s in steps] == [1, 1, 0]
    assert len(decode_snapshot(last_snapshot(steps)).incomplete_markers) == 1
    # A redelivery at its own position changes nothing either.
    state, _ = fold_all([spoiled], offsets_from=5)
    before = dict(state)
    res = fold_raw(state, *spoiled, position=(0, 5))
    assert not res.changed and [d.reason for d in res.deadletters] == ["CodecError"] and dict(state) == before


def test_a_record_that_names_no_valid_rollout_only_dead_letters():
    for key, value in [(b"no spaces", b"garbage"), (b"\xff\xfe", b"garbage"), (None, b"garbage"),
                       (None, encode_event(event("bad id", make_call([1], [2]))))]:
        res = fold_raw({}, key, value)
        assert len(res.deadletters) == 1 and not res.changed, key
    # No key, but a decodable event of a valid rollout with a bad call id: that rollout is marked.
    res = fold_raw({}, None, encode_event(event(R, started("a/b"))))
    assert [d.reason for d in res.deadletters] == ["ContractError"] and header_key(R) in res.writes


def test_a_refused_record_after_retirement_gives_one_dead_letter_with_its_own_reason():
    state, steps = fold_all([rec(event(R, make_call([1], [2]))), rec(event(R, finished()))])
    snap = decode_snapshot(last_snapshot(steps))
    fold_all([rec(event(R, retire(snap.snapshot_id, snap.version)))], state=state)
    res = fold_raw(state, *trailing(event(R, make_call([3], [4]))))
    assert [d.reason for d in res.deadletters] == ["CodecError"]  # not a second write_after_retire letter
    state.apply(res)
    assert state.retired(R) and state.header(R).writes_after_retire == 1


def test_valid_events_give_byte_identical_snapshots_to_a_direct_encoding():
    # Regression guard for the splice: what the fold emits is what the codec writes for the decoded snapshot.
    c1 = make_call([1, 2], [3])
    _, steps = fold_all([rec(event(R, c1)), rec(event(R, finished()))])
    data = last_snapshot(steps)
    assert encode_snapshot(decode_snapshot(data)) == data
