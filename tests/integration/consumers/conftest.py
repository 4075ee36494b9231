"""Consumer integration fixtures: topics of our own, a real ``tokentrail process`` worker, a raw publisher."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import confluent_kafka
import pytest

from schemas.codec import encode_event
from schemas.kafka.admin import ensure_topics
from schemas.kafka.config import PARTITIONER as PRODUCER_PARTITIONER
from schemas.kafka.topics import TopicNames, key_for, topic_names


@pytest.fixture(scope="module")
def topics(kafka_bootstrap) -> TopicNames:
    names = topic_names(f"itc{uuid.uuid4().hex[:8]}.")
    ensure_topics(kafka_bootstrap, names)
    return names


class Publisher:
    """Publishes contract events the way the interceptor does (murmur2_random, acks=all), synchronously."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self._producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                                   "enable.idempotence": True,
                                                   "partitioner": PRODUCER_PARTITIONER})

    def close(self) -> None:
        self._producer.flush(10)
        del self._producer  # destroyed now, while the broker is still up (no reconnect noise)
        gc.collect()

    def publish(self, events) -> list[tuple[int, int]]:
        """(partition, offset) of each event, in the order given (callbacks arrive per partition)."""
        acks: dict[int, tuple] = {}
        for n, ev in enumerate(events):
            self._producer.produce(self.topic, key=key_for(ev.rollout_id), value=encode_event(ev),
                                   on_delivery=lambda err, msg, n=n: acks.__setitem__(n, (err, msg)))
        assert self._producer.flush(30) == 0
        assert len(acks) == len(events) and all(err is None for err, _ in acks.values()), acks
        return [(acks[n][1].partition(), acks[n][1].offset()) for n in range(len(events))]


@pytest.fixture(scope="module")
def publisher(kafka_bootstrap, topics):
    pub = Publisher(kafka_bootstrap, topics.rollout_events)
    yield pub
    pub.close()


@pytest.fixture(scope="module")
def processor(kafka_bootstrap, topics, tmp_path_factory):
    """A real fold worker (``tokentrail process``) on this module's topics."""
    run_dir: Path = tmp_path_factory.mktemp("processor")
    log = run_dir / "processor.log"
    prefix = topics.rollout_events.removesuffix("tokentrail.rollout-events")
    with open(log, "wb") as handle:
        proc = subprocess.Popen(
            [sys.executable, "-m", "compose.cli", "process", "--bootstrap", kafka_bootstrap, "--data-dir",
             str(run_dir / "data"), "--app-id", f"{prefix}proc", "--topic-prefix", prefix, "--log-level", "INFO"],
            stdout=handle, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        deadline = time.monotonic() + 90
        while "Worker ready" not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the processor did not start:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.2)
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
