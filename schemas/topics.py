"""Topic names and the partitioning contract.

Every event of a rollout is keyed by the UTF-8 rollout id, so all of a rollout's
events land on one partition, in the order the producer acknowledged them.
Producers must use librdkafka's ``murmur2_random`` partitioner so that keys land
where Java, aiokafka and Faust put them (librdkafka's default, CRC32, does not).
"""

from __future__ import annotations

from dataclasses import dataclass

ROLLOUT_EVENTS = "tokentrail.rollout-events"
SNAPSHOTS = "tokentrail.snapshots"
REBUILT = "tokentrail.rebuilt"
DEADLETTER = "tokentrail.deadletter"

DEFAULT_PARTITIONS = 4
# Rollout events are the replayable source of truth: keep them a week.
ROLLOUT_EVENTS_RETENTION_MS = 7 * 24 * 3600 * 1000
# Snapshots of long rollouts are large (delta-encoded token arrays); the topic
# and the producers are configured for this limit.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024

PRODUCER_PARTITIONER = "murmur2_random"


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicNames:
    """The four topic names a deployment uses (configurable, these defaults)."""

    rollout_events: str = ROLLOUT_EVENTS
    snapshots: str = SNAPSHOTS
    rebuilt: str = REBUILT
    deadletter: str = DEADLETTER


def key_for(rollout_id: str) -> bytes:
    """The Kafka key of every event of ``rollout_id``."""
    return rollout_id.encode("utf-8")


def topic_names(prefix: str = "") -> TopicNames:
    """The default names, each prefixed (``"<prefix>tokentrail.rollout-events"``); isolates tests and tenants."""
    base = TopicNames()
    return TopicNames(
        rollout_events=prefix + base.rollout_events,
        snapshots=prefix + base.snapshots,
        rebuilt=prefix + base.rebuilt,
        deadletter=prefix + base.deadletter,
    )


def check_bootstrap(value: str) -> str:
    """A Kafka bootstrap list, ``host:port[,host:port]``; ValueError naming the value otherwise."""
    if not value or any(":" not in part for part in value.split(",")):
        raise ValueError(f"bootstrap must be host:port[,host:port], got {value!r}")
    return value
