"""What a tokentrail Kafka record carries besides its Avro value.

- Dead-letter headers: the processor and the consumer both send an event they
  cannot use to the dead-letter topic, unchanged (same key, same value), with
  three headers that say why and where it came from. One format, so a reader
  of the dead-letter topic parses one shape whoever wrote it:
  ``tokentrail-reason`` (an error class or reason code), ``tokentrail-detail``
  (UTF-8, cut to ``DETAIL_LIMIT`` bytes) and ``tokentrail-source``
  (``topic/partition/offset`` of the original record).
- Record headroom: the topic's ``max.message.bytes`` bounds a whole record
  batch (its framing, key and headers), not only the value, so a value must
  stay ``RECORD_HEADROOM`` under the limit to be accepted.
"""

from __future__ import annotations

__all__ = [
    "DETAIL_LIMIT", "REASON_HEADER", "DETAIL_HEADER", "SOURCE_HEADER", "RECORD_HEADROOM",
    "deadletter_headers", "value_limit",
]

REASON_HEADER = "tokentrail-reason"
DETAIL_HEADER = "tokentrail-detail"
SOURCE_HEADER = "tokentrail-source"
# A dead letter's detail is for a person reading it; a long traceback must not push the record over the limit.
DETAIL_LIMIT = 4000
# Batch framing, key and headers of one record stay well under this (a key is a rollout id, headers < 5 KiB).
RECORD_HEADROOM = 64 * 1024


def deadletter_headers(reason: str, detail: str, topic: str, partition: int,
                       offset: int) -> list[tuple[str, bytes]]:
    """The headers of a dead letter for the record at ``topic``/``partition``/``offset``, in a fixed order."""
    return [
        (REASON_HEADER, reason.encode()),
        (DETAIL_HEADER, detail.encode()[:DETAIL_LIMIT]),
        (SOURCE_HEADER, f"{topic}/{partition}/{offset}".encode()),
    ]


def value_limit(max_message_bytes: int) -> int:
    """The largest value a topic with ``max.message.bytes = max_message_bytes`` accepts, framing allowed for."""
    return max_message_bytes - RECORD_HEADROOM
