"""Every Kafka client setting of tokentrail, built in one place (pure: returns plain dicts).

Guarantees of a config from `producer_config`, whoever uses it (the interceptor,
the consumer's Kafka sink and retire path, the NeMo Gym adapters, compose and
the benchmarks):

- ``acks=all`` with idempotence: a record acknowledged is on every in-sync
  replica, and retries neither duplicate nor reorder a producer's records, so
  a rollout's events stay in the order they were acknowledged.
- ``murmur2_random`` (`PARTITIONER`): keys land where Java, aiokafka and Faust
  put them, and where ``schemas.kafka.partitioning.partition_for`` says
  (librdkafka's default, CRC32, does not).
- A record not acknowledged within ``delivery_timeout_ms`` fails (librdkafka
  stops retrying it), so nobody waits on an ack for ever; one request never
  waits longer than 30 s.
- Records up to ``schemas.kafka.topics.MAX_MESSAGE_BYTES`` are accepted.
- Nagle off and no compression: every producer here awaits each record's ack,
  so latency is the cost (the records are small events or already
  delta-encoded token arrays).

Every builder takes ``security``, the process's `KafkaSecurity` (``schemas.kafka.security``: TLS, SASL,
parsed once from ``--kafka-config``); its librdkafka settings go into every client the same way.

Callers' differences are keyword arguments, each with its reason at the call
site (e.g. ``linger_ms=0`` where a record is waited for alone, a longer
linger for bulk loads). `consumer_config` and `admin_config` do the same for
readers and the admin client. Nothing here imports a client library.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from schemas.kafka.security import KafkaSecurity
from schemas.kafka.topics import MAX_MESSAGE_BYTES

__all__ = [
    "PARTITIONER", "DEFAULT_LINGER_MS", "DEFAULT_DELIVERY_TIMEOUT_MS", "DEFAULT_FETCH_WAIT_MS", "QUIET_LOGGER",
    "producer_config", "consumer_config", "admin_config", "delivery_timeout_s",
]

PARTITIONER = "murmur2_random"
# One millisecond batches concurrent captures into one request without a noticeable delay.
DEFAULT_LINGER_MS = 1.0
DEFAULT_DELIVERY_TIMEOUT_MS = 30_000
# The longest a fetch waits at the broker for records. A client sends one fetch per broker at a time, so a
# partition left out of the fetch in flight (its records were still queued) is fetched again only when that
# fetch returns: the wait bounds the delay of its next record (librdkafka's default is 500 ms, faust's 1500),
# at the cost of one empty fetch per interval when idle.
DEFAULT_FETCH_WAIT_MS = 100
_MAX_REQUEST_TIMEOUT_MS = 30_000

# librdkafka logs every refused connection; the outcome reaches the caller as an error, so its log is muted.
# Built directly, not through logging.getLogger: a logger outside the manager's registry is one that
# logging.config (uvicorn's, a trainer's) never resets, so it stays muted whatever configures logging later.
QUIET_LOGGER = logging.Logger("tokentrail.kafka.librdkafka", level=logging.CRITICAL + 1)
QUIET_LOGGER.propagate, QUIET_LOGGER.disabled = False, True


def producer_config(bootstrap: str, *, linger_ms: float = DEFAULT_LINGER_MS,
                    delivery_timeout_ms: int = DEFAULT_DELIVERY_TIMEOUT_MS,
                    max_message_bytes: int = MAX_MESSAGE_BYTES, compression: str = "none",
                    security: KafkaSecurity | None = None,
                    extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The producer configuration every tokentrail producer uses (see the module docstring).

    ``extra`` adds librdkafka settings this builder does not know (tests, tuning); it may not
    override a contract setting (acks, idempotence, the partitioner): ValueError names it.
    """
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "partitioner": PARTITIONER,
        "linger.ms": linger_ms,
        "message.max.bytes": max_message_bytes,
        "delivery.timeout.ms": int(delivery_timeout_ms),
        "request.timeout.ms": int(min(delivery_timeout_ms, _MAX_REQUEST_TIMEOUT_MS)),
        "compression.type": compression,
        # Every record is awaited: no Nagle delay on the produce socket (one capture is one small request).
        "socket.nagle.disable": True,
    }
    return _merged(config, security, extra, fixed=("enable.idempotence", "acks", "partitioner"))


def consumer_config(bootstrap: str, group_id: str, *, partition_eof: bool = False,
                    session_timeout_ms: int | None = None, max_message_bytes: int = MAX_MESSAGE_BYTES,
                    fetch_wait_ms: int = DEFAULT_FETCH_WAIT_MS, security: KafkaSecurity | None = None,
                    extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A reader that commits only by hand and sees only committed (non-aborted) records.

    ``partition_eof``: report the end of a partition (readers of a range, not group members).
    """
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group_id,
        # Offsets are committed only after delivery (consumers.loop) or never (range readers).
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        "fetch.message.max.bytes": max_message_bytes,
        "max.partition.fetch.bytes": max_message_bytes,
        "fetch.wait.max.ms": int(fetch_wait_ms),
    }
    if partition_eof:
        config["enable.partition.eof"] = True
    if session_timeout_ms is not None:
        config["session.timeout.ms"] = session_timeout_ms
    return _merged(config, security, extra, fixed=("enable.auto.commit",))


def admin_config(bootstrap: str, *, logger: logging.Logger | None = QUIET_LOGGER,
                 security: KafkaSecurity | None = None,
                 extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """An admin client that notices a broker that just came up and keeps librdkafka's log quiet."""
    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "reconnect.backoff.max.ms": 1000}
    if logger is not None:
        config["logger"] = logger
    return _merged(config, security, extra, fixed=())


def delivery_timeout_s(config: Mapping[str, Any]) -> float:
    """How long a producer with ``config`` may take to acknowledge or fail a record (librdkafka default 300 s)."""
    return float(config.get("delivery.timeout.ms", 300_000)) / 1000


def _merged(config: dict[str, Any], security: KafkaSecurity | None, extra: Mapping[str, Any] | None, *,
            fixed: tuple[str, ...]) -> dict[str, Any]:
    secured = security.librdkafka() if security is not None else {}
    config.update(secured)
    for key, value in (extra or {}).items():
        if key in secured or key.startswith(("security.", "sasl.", "ssl.")):
            # ``extra`` may tune a client, never change how it authenticates (and never echo a secret).
            raise ValueError(f"{key}: how a client authenticates is set only by the Kafka client config file "
                             "(--kafka-config / TOKENTRAIL_KAFKA_CONFIG); set it there")
        if key in fixed and config[key] != value:
            raise ValueError(f"{key}={value!r}: tokentrail's Kafka contract fixes it to {config[key]!r}")
        config[key] = value
    return config
