"""schemas.kafka.partitioning: our murmur2 is Kafka's, bit for bit (the live check is in the bridge contract test)."""

from __future__ import annotations

import pytest

from schemas.kafka.partitioning import murmur2, partition_for

# Apache Kafka's UtilsTest.testMurmur2 vectors (Java ints).
KAFKA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize("key, expected", KAFKA_VECTORS.items())
def test_murmur2_matches_kafkas_vectors(key, expected):
    assert murmur2(key) == expected & 0xFFFFFFFF
    assert partition_for(key, 7) == (expected & 0x7FFFFFFF) % 7


# Kafka's vectors have no key of length 1 mod 4: tests/integration/schemas/test_kafka_bridge.py checks keys of
# every length against where the broker's own partitioner put them.


def test_a_partition_is_always_in_range_and_a_topic_has_partitions():
    for i in range(200):
        assert 0 <= partition_for(f"rollout-{i}".encode(), 4) < 4
    with pytest.raises(ValueError, match="at least one partition"):
        partition_for(b"k", 0)
