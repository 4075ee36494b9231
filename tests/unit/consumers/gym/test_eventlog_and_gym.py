"""Event-log partitioning (Kafka's murmur2) and the NeMo Gym entry conversion, without a broker."""

from __future__ import annotations

import json

import pytest

from consumers.replay.eventlog import murmur2, partition_for
from consumers.gym.adapters import call_to_entry, entry_to_call
from consumers.gym.conformance import gym_entry
from processors.fold import apply_writes, fold
from schemas.codec import decode_event, encode_event
from schemas.errors import ContractError
from schemas.hashing import compute_digest
from schemas.records import ParentResolution
from tests.factories import event, finished

# Apache Kafka's UtilsTest.testMurmur2 vectors (Java ints).
KAFKA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize("key, expected", KAFKA_VECTORS.items())
def test_murmur2_matches_kafkas_vectors(key, expected):
    assert murmur2(key) == expected & 0xFFFFFFFF
    assert partition_for(key, 7) == (expected & 0x7FFFFFFF) % 7


def test_gym_entries_round_trip_through_the_wire_form():
    entry = gym_entry("rollout-g", "call-1", [11, 12], [13, 14])
    entry["routed_experts"] = [[[1, 2]], [[3, 4]]]
    call = entry_to_call(entry)
    wire = decode_event(encode_event(event("rollout-g", call))).body
    assert json.dumps(call_to_entry("rollout-g", wire), sort_keys=True) == json.dumps(entry, sort_keys=True)


def test_an_unresolved_gym_entry_stays_unresolved_through_the_fold():
    entry = {**gym_entry("rollout-g", "call-1", [11, 12], [13, 14]), "parent_resolution": "unresolved",
             "parent_resolution_reason": "no_match"}
    state: dict = {}
    result = fold(state, event("rollout-g", entry_to_call(entry)))
    apply_writes(state, result)
    snap = fold(state, event("rollout-g", finished())).snapshots[0]
    assert snap.calls[0].call.parent_resolution is ParentResolution.UNRESOLVED


def test_delta_entries_need_their_parent_digest_and_lengths():
    parent = gym_entry("rollout-g", "call-1", [11, 12], [13, 14])
    delta = {**gym_entry("rollout-g", "call-2", [15], [16]), "prompt_is_delta": True, "parent_call_id": "call-1",
             "parent_resolution": "resolved", "cum_len": 6, "digest": compute_digest([11, 12, 13, 14, 15, 16])}
    call = entry_to_call(delta, parent_digest=parent["digest"])
    assert call.prompt_is_delta and call.parent_digest == parent["digest"] and call.cum_len == 6
    with pytest.raises(ContractError, match="cum_len and digest"):
        entry_to_call({**delta, "cum_len": None})


@pytest.mark.parametrize("change, message", [
    ({"schema_version": 2}, "reads versions 3..5"),
    ({"parent_resolution": None}, "pre-v3"),
])
def test_old_or_incoherent_gym_entries_are_refused(change, message):
    with pytest.raises(ContractError, match=message):
        entry_to_call({**gym_entry("rollout-g", "call-1", [1], [2]), **change})
