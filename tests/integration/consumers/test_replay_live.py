"""Replay against the live pipeline: the replayed snapshot and rebuilt record equal what the live
processor and consumer produced, byte for byte; the CLI explains a masked rollout; a 100k-event
log is scanned for one rollout without loading it into memory."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import tracemalloc
import uuid

import confluent_kafka
import pytest

from compose.harnesses.sdk import fault_tool, run_rollout
from consumers.rebuild import to_json_line
from consumers.replay.eventlog import EventLog
from consumers.replay.rollouts import replay_rollout
from schemas.codec import decode_snapshot, encode_event, encode_snapshot
from schemas.kafka.admin import ensure_topics, produce_all
from schemas.kafka.config import PARTITIONER as PRODUCER_PARTITIONER
from schemas.kafka.topics import key_for, topic_names
from tests.factories import event, incomplete

pytestmark = [pytest.mark.integration, pytest.mark.real_broker]


@pytest.fixture(scope="module")
def live(stack):
    tag = uuid.uuid4().hex[:6]
    clean, broken = f"rp-clean-{tag}", f"rp-broken-{tag}"

    async def run():
        return await asyncio.gather(run_rollout(stack.capture_base_url(clean), clean, "weather in Paris?"),
                                    run_rollout(stack.capture_base_url(broken), broken, "weather in Rome?",
                                                tool_impl=fault_tool(stack.upstream_kind, 1)))

    for o in asyncio.run(run()):
        stack.finish(o.rollout_id, {"reward": 0.0 if o.error else 1.0}, final_response_id=o.final_response_id,
                     final_text=o.final_text)
    stack.wait_rollouts([clean, broken], timeout=90)
    return clean, broken


def _live_snapshots(bootstrap: str, topic: str, rollout_id: str) -> list[bytes]:
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                                         "auto.offset.reset": "earliest", "enable.partition.eof": True})
    consumer.subscribe([topic])
    found, eofs, deadline = [], 0, time.monotonic() + 30
    while eofs < 4 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        if msg.error():
            eofs += msg.error().code() == confluent_kafka.KafkaError._PARTITION_EOF
            continue
        if msg.key() == rollout_id.encode():
            found.append(msg.value())
    consumer.close()
    return found


def test_replay_equals_the_live_pipeline_byte_for_byte(live, stack, kafka_bootstrap):
    lines = {}
    for line in stack.rollouts_path.read_bytes().splitlines(keepends=True):
        lines[line.split(b'"rollout_id":"')[1].split(b'"')[0].decode()] = line
    log = EventLog(kafka_bootstrap, stack.topics.rollout_events)
    try:
        for rollout_id in live:
            result = replay_rollout(log, rollout_id)
            live_snapshots = _live_snapshots(kafka_bootstrap, stack.topics.snapshots, rollout_id)
            assert live_snapshots and decode_snapshot(live_snapshots[-1]).snapshot_id == result.snapshot.snapshot_id
            assert live_snapshots[-1] == encode_snapshot(result.snapshot)
            assert lines[rollout_id] == to_json_line(result.rollout)
    finally:
        log.close()


def test_the_cli_names_the_failed_call_and_the_reason(live, stack, kafka_bootstrap):
    _, broken = live
    out = subprocess.run(
        [sys.executable, "-m", "compose.cli", "replay", "--bootstrap", kafka_bootstrap, "--topic-prefix",
         stack.topic_prefix, "--rollout", broken], capture_output=True, text=True, timeout=120, check=True,
    ).stdout
    assert f"rollout {broken}: MASKED" in out
    marker = next(line for line in out.splitlines() if line.strip().startswith("- call "))
    reason, status = ("upstream_error", 500) if stack.upstream_kind == "reference" else ("engine_rejected", 400)
    assert f"{reason} HTTP {status}" in marker
    assert f"capture_incomplete: {reason}" in out


def test_one_rollout_is_found_in_a_100k_event_log_with_bounded_memory(kafka_bootstrap):
    topics = topic_names(f"big{uuid.uuid4().hex[:6]}.")
    ensure_topics(kafka_bootstrap, topics)
    producer = confluent_kafka.Producer({"bootstrap.servers": kafka_bootstrap, "partitioner": PRODUCER_PARTITIONER,
                                         "linger.ms": 20, "batch.num.messages": 10000, "acks": "all"})
    target = "needle-rollout"
    noise = [encode_event(event(f"hay-{i}", incomplete(f"{i:032x}"))) for i in range(1000)]

    def records():
        for i in range(100_000):
            if i % 10_000 == 5_000:  # the needle's 10 events are spread through the log
                yield key_for(target), encode_event(event(target, incomplete(f"{i:032x}")))
            else:
                yield f"hay-{i % 1000}".encode(), noise[i % 1000]

    total = sum(len(value) for _, value in records())
    produce_all(producer, topics.rollout_events, records(), timeout=60)
    log = EventLog(kafka_bootstrap, topics.rollout_events)
    tracemalloc.start()
    try:
        result = replay_rollout(log, target)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        log.close()
    assert len(result.events) == 10 and result.rollout is None  # found every event; never finished
    assert peak < total / 4, f"replay held {peak} bytes for a {total}-byte log"
