"""The replay API: the in-memory state, the one fold loop, and that nothing else reads the state layout."""

from __future__ import annotations

import re
from pathlib import Path

from processors.fold import fold_raw
from processors.replay import MemoryState, replay
from processors.state import STATE_NESTED, RolloutHeader, header_key
from schemas import codec
from schemas.codec import encode_event
from tests.factories import event, finished, hashed, make_call, retire

REPO = Path(__file__).resolve().parents[3]
R = "rollout-replay"


def _events(rid: str = R):
    c1 = make_call([1, 2, 3], [4], continuation_fingerprint=hashed("fp1"))
    return [event(rid, c1), event(rid, finished())]


def test_replay_folds_records_pairs_and_events_alike_as_the_worker_does():
    evs = _events()
    pairs = [(e.rollout_id.encode(), encode_event(e)) for e in evs]
    by_pairs, by_events, by_hand = MemoryState(), MemoryState(), MemoryState()
    snaps_pairs = [s.data for step in replay(pairs, state=by_pairs) for s in step.result.emitted]
    snaps_events = [s.data for step in replay(evs, state=by_events) for s in step.result.emitted]
    for key, value in pairs:
        by_hand.apply(fold_raw(by_hand, key, value))
    assert by_pairs == by_events == by_hand and snaps_pairs == snaps_events and len(snaps_pairs) == 1


def test_offsets_give_kafka_positions_and_a_redelivery_changes_nothing():
    pairs = [(e.rollout_id.encode(), encode_event(e)) for e in _events()]
    state = MemoryState()
    list(replay(pairs, state=state, offsets_from=0))
    header = state.header(R)
    assert isinstance(header, RolloutHeader) and (header.applied_partition, header.applied_offset) == (0, 1)
    (again,) = replay(pairs[1:], state=state, offsets_from=1)
    assert not again.result.changed and again.snapshots  # the finish that froze this state re-emits


def test_stop_after_and_the_typed_accessors():
    evs = _events()
    steps = list(replay(evs, stop_after=evs[0].event_id))
    assert [s.event_id for s in steps] == [evs[0].event_id]
    state = MemoryState()
    (*_, fin) = replay(evs, state=state)
    snap = fin.snapshots[0]
    assert state.header(R).frozen and not state.retired(R) and state.header("unknown") is None
    list(replay([event(R, retire(snap.snapshot_id, snap.version))], state=state))
    assert state.retired(R) and list(state) == [header_key(R)]


def test_forget_retired_keeps_memory_to_the_rollouts_in_flight():
    a, b = _events("r1"), _events("r10")  # "r1" is a prefix of "r10": forgetting one keeps the other
    state = MemoryState()
    snaps = [s for step in replay([*a, *b], state=state) for s in step.snapshots]
    retire_a = event("r1", retire(snaps[0].snapshot_id, snaps[0].version))
    list(replay([retire_a], state=state, forget_retired=True))
    assert state.header("r1") is None and state.header("r10") is not None
    state.forget("r10")  # a live rollout: every key goes
    assert state == {}


def test_undecodable_records_are_dead_letters_and_a_fixed_key_is_checked():
    (step,) = replay([(b"r", b"garbage")])
    assert step.event_id is None and step.event() is None and step.result.deadletters[0].reason == "CodecError"
    (step,) = replay([(None, encode_event(_events()[0]))], key=b"other-rollout")
    assert "differs from rollout_id" in step.result.deadletters[0].detail


def test_state_records_do_not_touch_the_contract_codec_table():
    assert all(cls not in codec._NESTED for cls in STATE_NESTED if cls.__module__ == "processors.state")
    assert not hasattr(codec, "register_nested")


def test_outside_processors_only_the_fold_and_replay_api_are_imported():
    """ARCHITECTURE §3: consumers (and the benchmarks) never read the state key layout or its codecs."""
    allowed = {"processors.fold", "processors.replay"}
    for folder in ("consumers", "compose/tools/bench"):
        for path in (REPO / folder).rglob("*.py"):
            for module in re.findall(r"(?:from|import)\s+(processors(?:\.\w+)?)", path.read_text()):
                assert module in allowed, f"{path.relative_to(REPO)} imports {module}"
