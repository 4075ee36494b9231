"""A real `tokentrail consume` (and an in-process consumer) started before its topics exist, on the real broker.

It must not poll UNKNOWN_TOPIC for ever: it exits 4 within its ``--topic-wait``,
naming the missing topics and the `tokentrail topics` command, and creates
nothing; that very command then makes the next start deliver.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient

from consumers.loop import RebuildConsumer
from consumers.settings import ConsumerSettings
from consumers.sinks.plugin import JsonlSink
from schemas.codec import encode_snapshot
from schemas.kafka.topics import TopicsUnavailable, key_for, topic_names
from tests.unit.consumers.support import child, root, snapshot_of

pytestmark = [pytest.mark.integration, pytest.mark.real_broker]

REPO = Path(__file__).resolve().parents[3]


def topics_with(bootstrap: str, prefix: str) -> set[str]:
    return {t for t in AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics
            if t.startswith(prefix)}


def consume(bootstrap: str, prefix: str, out: Path, *extra: str, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "compose.cli", "consume", "--bootstrap", bootstrap, "--group-id", f"{prefix}cons",
         "--sink", "jsonl", "--sink-path", str(out), "--topic-prefix", prefix, *extra],
        cwd=REPO, capture_output=True, text=True, timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def test_consume_exits_4_naming_the_missing_topics_then_the_printed_command_fixes_it(kafka_bootstrap, tmp_path):
    prefix = f"itcm{uuid.uuid4().hex[:8]}."
    names = topic_names(prefix)
    out = tmp_path / "rollouts.jsonl"
    start = time.monotonic()
    first = consume(kafka_bootstrap, prefix, out, "--topic-wait", "3", timeout=60)
    elapsed = time.monotonic() - start
    assert first.returncode == 4, first.stderr
    assert elapsed < 45, f"took {elapsed:.1f} s"
    err = first.stderr
    assert f"tokentrail consume: missing Kafka topics on {kafka_bootstrap} after waiting 3 s:" in err
    for topic in (names.snapshots, names.deadletter, names.rollout_events):
        assert topic in err
    command = re.search(r"`(tokentrail topics [^`]+)`", err)
    assert command and command.group(1) == f"tokentrail topics --bootstrap {kafka_bootstrap} --topic-prefix {prefix}"
    assert "Traceback" not in err
    assert topics_with(kafka_bootstrap, prefix) == set(), "the consumer created topics"

    made = subprocess.run([sys.executable, "-m", "compose.cli", *command.group(1).split()[1:]], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    r = root([1, 2], [3])
    rid = f"cm-{uuid.uuid4().hex[:6]}"
    producer = confluent_kafka.Producer({"bootstrap.servers": kafka_bootstrap, "partitioner": "murmur2_random"})
    producer.produce(names.snapshots, key=key_for(rid), value=encode_snapshot(snapshot_of(r, child(r, [4], [5]),
                                                                                        rollout=rid)))
    assert producer.flush(10) == 0
    second = consume(kafka_bootstrap, prefix, out, "--topic-wait", "3", "--max-rollouts", "1")
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout.strip().splitlines()[-1])["delivered"] == 1
    assert [json.loads(line)["rollout_id"] for line in out.read_text().splitlines()] == [rid]


async def test_an_in_process_consumer_raises_within_its_wait_and_creates_nothing(kafka_bootstrap, tmp_path):
    prefix = f"itci{uuid.uuid4().hex[:8]}."
    names = topic_names(prefix)
    settings = ConsumerSettings(bootstrap=kafka_bootstrap, group_id=f"{prefix}cons", topics=names,
                                poll_timeout_s=0.1, topic_wait_s=2)
    consumer = RebuildConsumer(settings, JsonlSink(tmp_path / "out.jsonl"))
    start = time.monotonic()
    try:
        with pytest.raises(TopicsUnavailable) as info:
            await asyncio.wait_for(consumer.run(), 30)
    finally:
        await consumer.close()
    assert 2 <= time.monotonic() - start < 30
    assert set(info.value.missing) == {names.snapshots, names.deadletter, names.rollout_events}
    assert topics_with(kafka_bootstrap, prefix) == set()
