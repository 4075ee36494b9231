"""Rebuilt records of a collect run, read from the rebuilt topic as the consumer delivers them.

``RebuiltRecords`` follows every partition of ``tokentrail.rebuilt`` from a time on (the
run's start, so a resumed run also finds what was delivered before it was killed) in a
thread of its own, and keeps the first record delivered for each rollout id (as its JSON
record: the JSONL sink's shape). The consumer that writes the topic is the deployment's
(``tokentrail consume --sink kafka``; ``--local`` runs one). It is never a group member
and commits nothing: it reads, it does not take records from a trainer.

A record that does not decode is counted and skipped (the collector's row then times
out as ``delivery_timeout``): the topic's bytes are never guessed at.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from typing import Any

import confluent_kafka

from consumers.rebuild.output import to_json_dict
from schemas.codec import decode_rebuilt
from schemas.errors import TokentrailError, TransportError
from schemas.kafka.config import QUIET_LOGGER, consumer_config
from schemas.kafka.security import KafkaSecurity

__all__ = ["RebuiltRecords"]

log = logging.getLogger("tokentrail.collect.records")


class RebuiltRecords:
    def __init__(self, bootstrap: str, topic: str, *, from_ms: int, timeout_s: float = 30.0,
                 security: KafkaSecurity | None = None) -> None:
        """Start following ``topic`` on ``bootstrap`` (``security``: the run's --kafka-config; None: PLAINTEXT)."""
        self.topic = topic
        self.undecodable = 0
        self._records: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        try:
            self._consumer = confluent_kafka.Consumer(consumer_config(
                bootstrap, f"tokentrail-collect-{uuid.uuid4().hex}",
                extra={"fetch.wait.max.ms": 50, "logger": QUIET_LOGGER}, security=security))
            meta = self._consumer.list_topics(topic, timeout=timeout_s)
            found = meta.topics.get(topic)
            if found is None or found.error is not None or not found.partitions:
                raise TransportError(f"the rebuilt topic {topic} does not exist on {bootstrap}: run the consumer "
                                     "with --sink kafka (its topic), or create the topics with `tokentrail topics`")
            wanted = [confluent_kafka.TopicPartition(topic, p, max(from_ms, 0)) for p in found.partitions]
            starts = self._consumer.offsets_for_times(wanted, timeout=timeout_s)
            # offset -1: nothing at or after from_ms yet; read what comes next.
            self._consumer.assign([confluent_kafka.TopicPartition(topic, tp.partition, tp.offset if tp.offset >= 0
                                                                  else confluent_kafka.OFFSET_END) for tp in starts])
        except confluent_kafka.KafkaException as exc:
            raise TransportError(f"cannot read the rebuilt topic {topic} on {bootstrap}: {exc}") from exc
        self._thread = threading.Thread(target=self._follow, name="collect-records", daemon=True)
        self._thread.start()

    def get(self, rollout_id: str) -> dict[str, Any] | None:
        with self._lock:
            return self._records.get(rollout_id)

    async def wait(self, rollout_id: str, timeout_s: float) -> dict[str, Any] | None:
        """The rollout's first delivered record, or None after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            record = self.get(rollout_id)
            if record is not None or time.monotonic() >= deadline:
                return record
            await asyncio.sleep(0.1)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._consumer.close()

    def _follow(self) -> None:
        while not self._stop.is_set():
            try:
                msg = self._consumer.poll(0.2)
            except confluent_kafka.KafkaException as exc:
                log.warning("reading %s: %s", self.topic, exc)
                continue
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                if error.code() != confluent_kafka.KafkaError._PARTITION_EOF:
                    log.warning("reading %s: %s", self.topic, error)
                continue
            value: Any = msg.value()  # a tombstone (None) is refused by the codec like any undecodable value
            try:
                record = to_json_dict(decode_rebuilt(value))
            except (TokentrailError, ValueError) as exc:
                self.undecodable += 1
                log.warning("%s[%d]@%d: undecodable rebuilt record skipped: %s", self.topic, msg.partition(),
                            msg.offset(), exc)
                continue
            with self._lock:
                # At-least-once on the topic: the first delivery of a rollout stands.
                self._records.setdefault(record["rollout_id"], record)
