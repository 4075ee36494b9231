"""The NeMo Gym entry conversion, without a broker (Kafka's murmur2: tests/unit/schemas/test_kafka_partitioning.py)."""

from __future__ import annotations

import json

import pytest

from consumers.gym.adapters import call_to_entry, entry_to_call
from consumers.gym.conformance import gym_entry
from processors.replay import replay
from schemas.codec import decode_event, encode_event
from schemas.errors import ContractError
from schemas.hashing import compute_digest
from schemas.records import ParentResolution
from tests.factories import event, finished

# The murmur2 golden vectors moved with the partitioner: tests/unit/schemas/test_kafka_partitioning.py.


def test_gym_entries_round_trip_through_the_wire_form():
    entry = gym_entry("rollout-g", "call-1", [11, 12], [13, 14])
    entry["routed_experts"] = [[[1, 2]], [[3, 4]]]
    call = entry_to_call(entry)
    wire = decode_event(encode_event(event("rollout-g", call))).body
    assert json.dumps(call_to_entry("rollout-g", wire), sort_keys=True) == json.dumps(entry, sort_keys=True)


def test_an_unresolved_gym_entry_stays_unresolved_through_the_fold():
    entry = {**gym_entry("rollout-g", "call-1", [11, 12], [13, 14]), "parent_resolution": "unresolved",
             "parent_resolution_reason": "no_match"}
    (snap,) = [s for step in replay([event("rollout-g", entry_to_call(entry)), event("rollout-g", finished())])
               for s in step.snapshots]
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


@pytest.mark.parametrize("bad", ["", "call/3", "a b", "x" * 201])
async def test_a_call_id_the_processor_would_dead_letter_is_refused_before_anything_is_published(bad):
    from consumers.gym.adapters import TokenSink

    sink = TokenSink("127.0.0.1:1")  # never reached: the id is refused before a producer exists
    with pytest.raises(ContractError, match="model_call_id"):
        await sink.put(gym_entry("rollout-g", bad, [11, 12], [13, 14]))
    with pytest.raises(ContractError, match="CallStarted.model_call_id"):
        await sink.begin_call("rollout-g", bad)
    assert sink._client._producer is None
    await sink.close()


def test_a_freeze_over_an_undecodable_record_answers_the_processors_decision_instead_of_raising():
    from consumers.gym.adapters import _fold_until
    from consumers.replay.eventlog import LoggedEvent
    from schemas.kafka.topics import key_for
    from tests.factories import make_call

    call = make_call([11, 12], [13, 14], call_id="call-1")
    good = encode_event(event("rollout-g", call))
    finish = event("rollout-g", finished())
    values = [good, good + b"\x00trailing", encode_event(finish)]  # the second one the codec refuses
    records = [LoggedEvent(0, n, 0, value, key_for("rollout-g")) for n, value in enumerate(values)]
    snapshot, calls = _fold_until(iter(records), "rollout-g", finish.event_id)
    assert snapshot.incomplete and list(calls) == ["call-1"]
    assert [sc.call.model_call_id for sc in snapshot.calls] == ["call-1"]
