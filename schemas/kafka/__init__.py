"""The Kafka binding of the wire contract: how tokentrail's records travel on Kafka.

Pure (standard library only, importable anywhere): ``config`` (every producer,
consumer and admin client setting, built in one place), ``partitioning``
(Kafka's murmur2 partitioner, so a reader finds a rollout's partition) and
``framing`` (what a record carries besides its Avro value: dead-letter headers,
the batch headroom under the topic limit).

Framework edges (the only ``schemas`` modules that import ``confluent_kafka``):
``bridge`` (the one acked producer and the AdminClient factory) and ``scan``
(reading a partition range, from an offset or a time). They are never imported
by this package itself, so ``import schemas.kafka.config`` stays framework-free;
the names below resolve lazily for convenience.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["AckedProducer", "PublishFailed", "TopicReader", "admin_client"]

_LAZY = {"AckedProducer": "bridge", "PublishFailed": "bridge", "admin_client": "bridge", "TopicReader": "scan"}


def __getattr__(name: str) -> Any:
    # Importing a framework edge only when one of its names is asked for keeps the pure modules pure.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
