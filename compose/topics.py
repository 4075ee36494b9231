"""Create tokentrail's topics on a broker, idempotently, and fill one in bulk.

Guarantees: after `ensure_topics` returns, the six topics exist (created now, or
already there: their existing settings are left alone); rollout-events keeps a week of
history so replay works, and snapshots/rebuilt accept messages up to
``schemas.topics.MAX_MESSAGE_BYTES`` (rebuilt-groups too); policy-versions is compacted, with one partition. Any failure is a `TopicError` naming the topic,
the broker and the reason. `produce_all` returns only once Kafka acknowledged every
record (benchmarks and tests publish their workloads with it).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import NewTopic

from schemas.errors import TokentrailError, TransportError
from schemas.kafka.bridge import AckedProducer, PublishFailed, admin_client
from schemas.topics import (DEFAULT_PARTITIONS, MAX_MESSAGE_BYTES, ROLLOUT_EVENTS_RETENTION_MS,
                            TopicNames)


class TopicError(TokentrailError):
    """A topic could not be created or the broker could not be reached."""


def topic_configs(names: TopicNames) -> dict[str, dict[str, str]]:
    """Topic name -> topic-level config overrides."""
    big = {"max.message.bytes": str(MAX_MESSAGE_BYTES)}
    return {
        names.rollout_events: {"retention.ms": str(ROLLOUT_EVENTS_RETENTION_MS), **big},
        names.snapshots: dict(big),
        names.rebuilt: dict(big),
        names.rebuilt_groups: dict(big),  # a group holds all its members' records
        # Dead letters carry the undecodable event itself, so they can be as large as one.
        names.deadletter: dict(big),
        # One record per label, the latest kept: the whole history of versions stays small.
        names.policy_versions: {"cleanup.policy": "compact"},
    }


# Topics whose partition count is fixed whatever --partitions says: announcements are read in order.
def _partitions_of(names: TopicNames, name: str, partitions: int) -> int:
    return 1 if name == names.policy_versions else partitions


def ensure_topics(bootstrap: str, names: TopicNames | None = None,
                  partitions: int = DEFAULT_PARTITIONS, *, timeout: float = 30.0) -> None:
    """Create the topics of ``names`` on ``bootstrap``; existing topics count as success.

    ``timeout`` bounds the wait for the broker to answer (it may still be starting, e.g.
    under docker compose) and then the wait for the creations.
    """
    names = names or TopicNames()
    # Quiet (librdkafka would print every refused connection while the broker starts; what matters
    # reaches the caller as a TopicError) and quick to notice a broker that just came up.
    try:
        admin = admin_client(bootstrap)
    except TransportError as exc:
        raise TopicError(str(exc)) from exc
    _wait_for_broker(admin, bootstrap, timeout)
    # replication_factor=-1: the broker's default.replication.factor (1 on a dev broker).
    new = [NewTopic(name, num_partitions=_partitions_of(names, name, partitions), replication_factor=-1, config=config)
           for name, config in topic_configs(names).items()]
    futures = admin.create_topics(new, operation_timeout=timeout, request_timeout=timeout)
    failures = []
    for name, future in futures.items():
        try:
            future.result(timeout=timeout + 5)
        except KafkaException as exc:
            err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            if err is not None and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue
            failures.append(f"{name}: {err.str() if err is not None else exc}")
        except Exception as exc:  # the future's own timeout
            failures.append(f"{name}: {type(exc).__name__}: {exc}")
    if failures:
        raise TopicError(f"could not create topics on {bootstrap}: " + "; ".join(failures))


def _wait_for_broker(admin: Any, bootstrap: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if admin.list_topics(timeout=min(2.0, max(0.1, deadline - time.monotonic()))).brokers:
                return
        except KafkaException:
            pass
        if time.monotonic() >= deadline:
            raise TopicError(f"no Kafka broker answered at {bootstrap} within {timeout:.0f} s: "
                             "check the address, or start one with `tokentrail kafka up`")
        time.sleep(0.2)


def produce_all(producer: Any, topic: str, records: Iterable[tuple[bytes, bytes]],
                *, timeout: float = 120.0) -> None:
    """Produce ``(key, value)`` records in order, waiting for room when the local queue is full.

    ``producer``: a confluent-kafka ``Producer`` built from ``schemas.kafka.config.producer_config``
    (or an ``AckedProducer``). Returns once Kafka acknowledged every record (the bridge's
    ``produce_all``); otherwise raises `TopicError` with the first delivery error or the number of
    records still unacknowledged after ``timeout``.
    """
    bridge = producer if isinstance(producer, AckedProducer) else AckedProducer(client=producer)
    try:
        bridge.produce_all(topic, records, timeout_s=timeout)
    except PublishFailed as exc:
        raise TopicError(str(exc)) from exc
