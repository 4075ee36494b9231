"""Reading a rollout's dead letters back from the broker, for the integration tests."""

from __future__ import annotations

import time
import uuid

import confluent_kafka


def dead_letters(bootstrap: str, topic: str, key: bytes, want: int = 1,
                 timeout: float = 60.0) -> list[tuple[dict[str, bytes], bytes]]:
    """The dead letters keyed ``key`` on ``topic`` (headers, value), once ``want`` came or ``timeout`` passed."""
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": f"itdl-{uuid.uuid4().hex}",
                                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    out: list[tuple[dict[str, bytes], bytes]] = []
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and len(out) < want:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error() and msg.key() == key:
                out.append((dict(msg.headers() or []), msg.value()))
        return out
    finally:
        consumer.close()
