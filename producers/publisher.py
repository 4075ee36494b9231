"""Publish events to Kafka and await ``acks=all`` from asyncio.

The confluent-kafka sync ``Producer`` with a poll thread that resolves asyncio
futures: about a millisecond per acknowledged message, where awaiting
``AIOProducer`` sends one by one takes seconds (reference/stack.md §3). The
producer is idempotent (acks=all, no reordering) and uses ``murmur2_random``
so keys land on the partitions Java, aiokafka and Faust expect.

``publish`` returns only once the broker has acknowledged the record; any
failure raises ``TransportError``. Events of one rollout are produced in call
order from one producer, so they are acknowledged in that order.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import confluent_kafka

from schemas.codec import encode_event
from schemas.errors import TransportError
from schemas.records import RolloutEvent
from schemas.topics import MAX_MESSAGE_BYTES, PRODUCER_PARTITIONER, key_for


class PublishFailed(TransportError):
    """Kafka did not acknowledge a record. ``possibly_persisted``: the broker may hold it anyway
    (its ack was lost), so whoever retries must check before publishing it again."""

    def __init__(self, message: str, *, possibly_persisted: bool, permanent: bool = False) -> None:
        super().__init__(message)
        self.possibly_persisted = possibly_persisted
        self.permanent = permanent


# Errors after which the record certainly never reached a broker.
# (The Python client does not expose librdkafka's per-message persistence status, so
# every other failure, a message timeout included, counts as possibly persisted.)
_NOT_SENT = {confluent_kafka.KafkaError._TIMED_OUT_QUEUE, confluent_kafka.KafkaError._PURGE_QUEUE}
# Errors no retry can fix.
_PERMANENT = {confluent_kafka.KafkaError.MSG_SIZE_TOO_LARGE, confluent_kafka.KafkaError._INVALID_ARG}


def producer_config(bootstrap: str, *, linger_ms: float = 1.0, delivery_timeout_ms: int = 30_000,
                    max_message_bytes: int = MAX_MESSAGE_BYTES) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "partitioner": PRODUCER_PARTITIONER,
        "linger.ms": linger_ms,
        "message.max.bytes": max_message_bytes,
        "delivery.timeout.ms": delivery_timeout_ms,
        "request.timeout.ms": min(delivery_timeout_ms, 30_000),
        "compression.type": "none",
        # Latency first: no Nagle delay on the produce socket (one capture is one small request).
        "socket.nagle.disable": True,
    }


class KafkaPublisher:
    """Thread-bridged idempotent producer; ``await publish(...)`` resolves on the broker's ack."""

    def __init__(self, config: dict[str, Any]) -> None:
        try:
            self._producer = confluent_kafka.Producer(config)
        except confluent_kafka.KafkaException as exc:
            raise TransportError(f"cannot create the Kafka producer: {exc}") from exc
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="kafka-publisher-poll", daemon=True)
        self._thread.start()
        self.closed = False

    def _poll(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(0.05)  # delivery callbacks run on this thread

    async def publish_raw(self, topic: str, key: bytes, value: bytes) -> tuple[int, int]:
        """Produce one record; return (partition, offset) once acknowledged by all in-sync replicas."""
        if self.closed:  # no poll thread would ever resolve the ack
            raise PublishFailed(f"the producer for {topic} is closed", possibly_persisted=False, permanent=True)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[tuple[int, int]] = loop.create_future()

        def on_delivery(err: Any, msg: Any) -> None:
            def resolve() -> None:
                if future.done():
                    return
                if err is not None:
                    code = err.code()
                    future.set_exception(PublishFailed(
                        f"Kafka did not acknowledge the event: {err}",
                        possibly_persisted=code not in _NOT_SENT and code not in _PERMANENT,
                        permanent=code in _PERMANENT,
                    ))
                else:
                    future.set_result((msg.partition(), msg.offset()))

            loop.call_soon_threadsafe(resolve)

        while True:
            try:
                self._producer.produce(topic, value=value, key=key, on_delivery=on_delivery)
                break
            except BufferError:
                await asyncio.sleep(0.005)  # local queue full: back-pressure the request
            except (confluent_kafka.KafkaException, ValueError) as exc:
                raise PublishFailed(f"cannot produce to {topic}: {exc}", possibly_persisted=False,
                                    permanent=True) from exc
        return await future

    async def publish(self, topic: str, event: RolloutEvent) -> tuple[int, int]:
        return await self.publish_raw(topic, key_for(event.rollout_id), encode_event(event))

    async def close(self, timeout_s: float = 30.0) -> int:
        """Flush what is queued (returns how many records were left unflushed) and stop the poll thread.

        Idempotent: a second call returns 0."""
        if self.closed:
            return 0
        self.closed = True
        loop = asyncio.get_running_loop()
        left = await loop.run_in_executor(None, self._producer.flush, timeout_s)
        self._stop.set()
        await loop.run_in_executor(None, self._thread.join)
        return int(left)
