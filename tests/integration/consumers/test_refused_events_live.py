"""Refused events on the live pipeline (issue 15, items 5 and 13): a real worker, the consumer, the broker.

A rollout whose events include one with bytes after its Avro body and one with a malformed
model_call_id, interleaved with good ones, is delivered: the bad events are dead-lettered with
their reasons, the good calls are rebuilt, and the rollout is masked (``capture_incomplete``:
``invalid_event``), because what the refused events carried is lost (fail closed). Before the
fix the trailing-bytes event was folded and the snapshot built from it could not be decoded:
the rollout was never delivered, masked or not, and never retired. A bystander rollout on the
same topics is delivered unmasked.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import confluent_kafka
import pytest

from consumers.replay.eventlog import EventLog
from processors.replay import MemoryState, replay
from schemas.codec import encode_event
from schemas.kafka.config import PARTITIONER
from schemas.kafka.topics import key_for
from schemas.records import IncompleteReason, MaskCode
from tests.factories import event
from tests.integration.consumers.delivery import consume
from tests.integration.deadletters import dead_letters
from tests.unit.consumers.support import child, declared, root

pytestmark = [pytest.mark.integration, pytest.mark.real_broker]


def _publish_raw(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    """(key, value) records as the interceptor publishes them (one idempotent producer: order kept)."""
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                                         "partitioner": PARTITIONER})
    errors: list = []
    for key, value in records:
        producer.produce(topic, key=key, value=value, on_delivery=lambda err, _msg: err and errors.append(err))
    assert producer.flush(30) == 0 and not errors, errors


def _retired(bootstrap: str, topic: str, rollout_id: str, timeout: float = 30.0) -> bool:
    """Whether the rollout's logged events, folded as replay does, end retired (the consumer retires after delivery)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = EventLog(bootstrap, topic)
        try:
            state = MemoryState()
            for _ in replay(log.rollout_events(rollout_id), state=state, key=key_for(rollout_id)):
                pass
        finally:
            log.close()
        if state.retired(rollout_id):
            return True
        time.sleep(0.5)
    return False


async def test_trailing_bytes_and_bad_call_id_events_are_dead_lettered_and_the_rollout_is_delivered_masked(
        kafka_bootstrap, topics, processor):
    tag = uuid.uuid4().hex[:6]
    rid, bystander = f"refused-{tag}", f"bystander-{tag}"
    c1 = root(range(100, 140), range(200, 210))
    c2 = child(c1, range(300, 305), range(400, 412))
    # A root call: its body is stored as it came (a verified child's may be re-encoded as a delta), so
    # before the fix the 3 trailing bytes went into the snapshot and made it undecodable.
    spoiled = root(range(800, 820), range(900, 905))
    bad_id = root(range(600, 610), range(700, 705), call_id="call/3")  # '/' is outside CALL_ID_RULE
    b1 = root(range(10, 20), range(20, 25))
    trailing_value = encode_event(event(rid, spoiled, event_id=f"ev-trailing-{tag}")) + b"\x00\x00\x07"
    bad_id_value = encode_event(event(rid, bad_id))
    good = lambda ev: (key_for(ev.rollout_id), encode_event(ev))  # noqa: E731
    records = [good(event(rid, c1)), (key_for(rid), trailing_value), good(event(bystander, b1)),
               good(event(rid, c2)), (key_for(rid), bad_id_value), good(event(bystander, declared(b1))),
               good(event(rid, declared(c2)))]
    await asyncio.to_thread(_publish_raw, kafka_bootstrap, topics.rollout_events, records)

    got = await consume(kafka_bootstrap, topics, {rid, bystander}, timeout=90.0)

    delivered = got[rid]
    assert delivered.mask_sample is True
    (reason,) = delivered.mask_reasons
    assert reason.code == MaskCode.CAPTURE_INCOMPLETE and f"{IncompleteReason.INVALID_EVENT} x2" in reason.detail
    assert [s.model_call_id for s in delivered.trajectory.spans] == [c1.model_call_id, c2.model_call_id]
    assert delivered.metrics.n_calls == 2  # the good calls are unharmed; the refused ones never reached state
    assert got[bystander].mask_sample is False and got[bystander].mask_reasons == []

    dead = await asyncio.to_thread(dead_letters, kafka_bootstrap, topics.deadletter, key_for(rid), 2)
    by_value = {value: headers for headers, value in dead}
    assert by_value[trailing_value]["tokentrail-reason"] == b"CodecError"
    assert b"has 3 byte(s) after its Avro body" in by_value[trailing_value]["tokentrail-detail"]
    assert by_value[bad_id_value]["tokentrail-reason"] == b"ContractError"
    assert b"invalid CallCaptured.model_call_id 'call/3'" in by_value[bad_id_value]["tokentrail-detail"]

    # Delivered, so retired: the masked rollout's state is handed off like any other.
    assert await asyncio.to_thread(_retired, kafka_bootstrap, topics.rollout_events, rid)
