"""Create tokentrail's topics on a broker, idempotently, and fill one in bulk (a Kafka-client edge).

Guarantees: after `ensure_topics` returns, every topic of ``schemas.kafka.topics.TOPICS`` exists
(created now with its row's config and partition count, or already there: its existing
settings are left alone). Any failure is a `TopicError` naming the topic, the broker and the
reason. `produce_all` returns only once Kafka acknowledged every
record (benchmarks and tests publish their workloads with it).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import NewTopic

from schemas.errors import TokentrailError, TransportError
from schemas.kafka.bridge import AckedProducer, KafkaAuthFailed, PublishFailed, admin_client
from schemas.kafka.security import KafkaSecurity
from schemas.kafka.topics import DEFAULT_PARTITIONS, TopicNames, partitions_of


class TopicError(TokentrailError):
    """A topic could not be created or the broker could not be reached."""


def ensure_topics(bootstrap: str, names: TopicNames | None = None,
                  partitions: int = DEFAULT_PARTITIONS, *, timeout: float = 30.0,
                  security: KafkaSecurity | None = None) -> None:
    """Create the topics of ``names`` on ``bootstrap``; existing topics count as success.

    ``timeout`` bounds the wait for the broker to answer (it may still be starting, e.g.
    under docker compose) and then the wait for the creations.
    """
    names = names or TopicNames()
    # Quiet (librdkafka would print every refused connection while the broker starts; what matters
    # reaches the caller as a TopicError) and quick to notice a broker that just came up.
    try:
        admin = admin_client(bootstrap, security=security)
    except TransportError as exc:
        raise TopicError(str(exc)) from exc
    _wait_for_broker(admin, bootstrap, timeout)
    # replication_factor=-1: the broker's default.replication.factor (1 on a dev broker).
    new = [NewTopic(name, num_partitions=partitions_of(spec, partitions), replication_factor=-1, config=dict(spec.config))
           for name, spec in names.specs().items()]
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
        except KafkaAuthFailed as exc:  # final: waiting cannot help
            raise TopicError(str(exc)) from exc
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
