"""The local spool and the durable writer: nothing acknowledged is lost, order is kept."""

from __future__ import annotations

import asyncio
import tracemalloc

import httpx
import pytest

from producers.capture import c_heap
from producers.capture.durable import DurableWriter
from producers.capture.spool import UNCERTAIN, Spool
from schemas.codec import encode_event
from schemas.errors import DurabilityError
from schemas.event_bytes import event_id_of
from tests.factories import event, incomplete
from tests.unit.producers.conftest import vllm_chat_response


def test_spool_survives_reopen_and_cuts_a_torn_tail(tmp_path):
    spool = Spool(tmp_path)
    for i in range(3):
        spool.append("t", b"k%d" % i, b"v%d" % i, flags=UNCERTAIN if i == 1 else 0)
    spool.pop(spool.head())
    spool.close()
    with open(tmp_path / "spool.log", "ab") as fh:
        fh.write(b"\x00\x00\x00\x40torn")  # a crash mid-append
    again = Spool(tmp_path)
    assert len(again) == 2
    again.append("t", b"k3", b"v3")
    drained = []
    while len(again):
        record = again.head()
        drained.append((record.topic, record.key, record.value, record.uncertain))
        again.pop(record)
    assert drained == [("t", b"k1", b"v1", True), ("t", b"k2", b"v2", False), ("t", b"k3", b"v3", False)]
    assert (tmp_path / "spool.log").stat().st_size == 0
    again.close()


def test_spooled_bytes_stay_on_disk_not_in_memory(tmp_path):
    """A long outage costs disk: 200 spooled 50 KB records hold well under a megabyte of the process's memory."""
    spool = Spool(tmp_path)
    value = bytes(50_000)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(200):
            spool.append("t", b"k%d" % i, value)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(spool) == 200 and held < 1_000_000, held  # the values alone are 10 MB
    first = spool.head()
    assert first is not None and first.key == b"k0" and first.value == value
    spool.close()


def test_one_spool_per_process(tmp_path):
    first = Spool(tmp_path)
    with pytest.raises(DurabilityError, match="in use by another interceptor"):
        Spool(tmp_path)
    first.close()


class FlakyPublisher:
    def __init__(self):
        self.up = False
        self.sent: list[bytes] = []

    async def produce(self, topic, key, value):
        from schemas.kafka.bridge import PublishFailed

        if not self.up:
            raise PublishFailed("down", possibly_persisted=True)
        self.sent.append(value)
        return 0, len(self.sent)


async def _wait(predicate, timeout=5.0):
    for _ in range(int(timeout / 0.02)):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")


async def test_writer_spools_while_kafka_is_down_and_drains_in_order_exactly_once(tmp_path):
    pub = FlakyPublisher()
    writer = DurableWriter(pub, Spool(tmp_path), bootstrap="unused:1")
    already_there = encode_event(event("r", incomplete("a" * 32)))
    writer._present_event_ids = lambda topic: {event_id_of(already_there)}  # its lost ack had landed
    values = [already_there] + [encode_event(event("r", incomplete(f"{i:032x}"))) for i in range(1, 4)]
    assert [await writer.write("t", b"r", v) for v in values] == ["spool"] * 4
    pub.up = True
    await _wait(lambda: writer.spooled == 0)
    assert pub.sent == values[1:]  # in order, and the one already on the topic is not published twice
    assert await writer.write("t", b"r", b"direct") == "kafka"
    await writer.close()
    # Once drained, the outage's memory goes back to the OS (producers.capture.c_heap); a write straight
    # to Kafka never trims.
    assert writer.trims == (1 if c_heap.AVAILABLE else 0)


async def test_restart_drains_what_the_previous_run_spooled(tmp_path):
    pub = FlakyPublisher()
    writer = DurableWriter(pub, Spool(tmp_path), bootstrap="unused:1")
    writer._present_event_ids = lambda topic: set()
    await writer.write("t", b"r", encode_event(event("r", incomplete("b" * 32))))
    await writer.close(timeout_s=0.1)  # Kafka still down: the record stays spooled
    pub.up = True
    restarted = DurableWriter(pub, Spool(tmp_path), bootstrap="unused:1")
    restarted._present_event_ids = lambda topic: set()
    restarted.start()
    await _wait(lambda: restarted.spooled == 0)
    assert len(pub.sent) == 1
    await restarted.close()


async def test_without_a_spool_a_down_broker_means_503(interceptor, upstream, publisher):
    upstream.responses.append(httpx.Response(200, json=vllm_chat_response([1], [2])))
    publisher.fail = True
    r = await interceptor.post("/ng-rollout/s-1/training-token-capture/v1/chat/completions",
                               json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 503


async def test_with_a_spool_a_down_broker_still_answers_and_reports_depth(make_interceptor, publisher, tmp_path):
    http, app = await make_interceptor(spool_dir=tmp_path / "spool")
    publisher.fail = True
    r = await http.post("/ng-rollout/s-2/training-token-capture/v1/chat/completions",
                        json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 200
    assert (await http.get("/healthz")).json()["spooled"] == 2  # the call's intent, then its capture
    assert b"tokentrail_spool_depth 2.0" in (await http.get("/metrics")).content
    app.core.writer._present_event_ids = lambda topic: set()
    publisher.fail = False
    await _wait(lambda: app.core.writer.spooled == 0)
    assert len(publisher.events) == 1 and [e.body.model_call_id for e in publisher.intents] == [
        publisher.events[0].body.model_call_id]
