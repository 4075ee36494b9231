"""Kafka's default partitioner for keyed records, so readers find a rollout's partition without a scan.

Guarantee: ``partition_for(key, n)`` is the partition that librdkafka's
``murmur2_random`` partitioner (the one ``schemas.kafka.config`` configures for
every producer), Java's ``DefaultPartitioner``, aiokafka and Faust choose for
``key`` on a topic of ``n`` partitions. ``murmur2`` is Java's
``Utils.murmur2``, bit for bit (golden vectors in
``tests/unit/schemas/test_kafka_partitioning.py``; the live agreement with the
broker in ``tests/integration/schemas/test_kafka_bridge.py``).
"""

from __future__ import annotations

__all__ = ["murmur2", "partition_for"]

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK32 = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (Java ``Utils.murmur2``, librdkafka ``murmur2_random``), as an unsigned 32-bit value."""
    length = len(data)
    h = (_SEED ^ length) & _MASK32
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = data[i] | data[i + 1] << 8 | data[i + 2] << 16 | data[i + 3] << 24
        k = (k * _M) & _MASK32
        k ^= k >> 24
        k = (k * _M) & _MASK32
        h = ((h * _M) & _MASK32) ^ k
    extra = length % 4
    if extra == 3:
        h ^= data[whole + 2] << 16
    if extra >= 2:
        h ^= data[whole + 1] << 8
    if extra >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return h


def partition_for(key: bytes, partitions: int) -> int:
    """The partition a keyed record lands on (Java's ``toPositive(murmur2(key)) % partitions``)."""
    if partitions < 1:
        raise ValueError(f"partitions={partitions}: a topic has at least one partition")
    return (murmur2(key) & 0x7FFFFFFF) % partitions
