"""The thin Faust shell around the pure fold: decode, fold, store, emit.

Faust runs ``at_least_once`` (its exactly-once mode has open duplicate and
rebalance bugs); the fold is idempotent, so redelivery is harmless. State lives
in a RocksDB table through rocksdict, values raw bytes (our own Avro), memory
bounded by ``ProcessorSettings.rocksdb``. A snapshot is awaited until Kafka
acknowledges it before the next event is taken, so an acknowledged freeze is
never lost; a crash before that re-delivers the finish, which re-emits the
same snapshot identity.
"""

from __future__ import annotations

import logging
from typing import Any

import faust

from processors.fold import DeadLetter, fold_raw
from processors.settings import ProcessorSettings
from schemas.codec import encode_snapshot
from schemas.topics import MAX_MESSAGE_BYTES

log = logging.getLogger("tokentrail.processor")

STATE_TABLE = "rollout-state"


class _TableReader:
    __slots__ = ("_table",)

    def __init__(self, table: Any) -> None:
        self._table = table

    def get(self, key: bytes) -> bytes | None:
        return self._table.get(key)


def create_app(settings: ProcessorSettings) -> faust.App:
    p = settings.partitions
    app = faust.App(
        settings.app_id,
        broker=[f"kafka://{b}" for b in settings.bootstrap.split(",")],
        store="rocksdb://",
        datadir=str(settings.data_dir),
        processing_guarantee="at_least_once",
        topic_partitions=p,
        topic_replication_factor=1,
        table_standby_replicas=0,
        consumer_auto_offset_reset="earliest",
        web_enabled=settings.web_port is not None,
        web_port=settings.web_port or 6066,
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=settings.heartbeat_interval_s,
        broker_rebalance_timeout=settings.rebalance_timeout_s,
        broker_commit_interval=settings.commit_interval_s,
        producer_max_request_size=MAX_MESSAGE_BYTES,
        consumer_max_fetch_size=MAX_MESSAGE_BYTES,
        producer_acks=-1,
    )
    raw = dict(key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw", partitions=p)
    events = app.topic(settings.topics.rollout_events, **raw)
    snapshots = app.topic(settings.topics.snapshots, **raw)
    deadletter = app.topic(settings.topics.deadletter, **raw)
    table = app.Table(STATE_TABLE, default=None, partitions=p, key_type=bytes, value_type=bytes,
                      options=settings.rocksdb.as_options())
    # Tables derive serializers from their types (json for bytes); state values are our own Avro bytes.
    table.key_serializer = "raw"
    table.value_serializer = "raw"
    reader = _TableReader(table)

    @app.agent(events, name="fold")
    async def fold_agent(stream: faust.StreamT) -> None:
        async for event in stream.events():
            message = event.message
            result = fold_raw(reader, event.key, event.value)
            for key, value in result.writes.items():
                if value is None:
                    if key in table:
                        del table[key]
                else:
                    table[key] = value
            for snapshot in result.snapshots:
                fut = await snapshots.send(key=snapshot.rollout_id.encode(), value=encode_snapshot(snapshot))
                await fut
            for dead in result.deadletters:
                fut = await deadletter.send(
                    key=event.key, value=event.value,
                    headers=_deadletter_headers(dead, message.topic, message.partition, message.offset),
                )
                await fut
                log.warning("dead letter %s at %s[%d]@%d: %s", dead.reason, message.topic, message.partition,
                            message.offset, dead.detail)

    app.tokentrail_table = table  # type: ignore[attr-defined]
    return app


def _deadletter_headers(dead: DeadLetter, topic: str, partition: int, offset: int) -> list[tuple[str, bytes]]:
    return [
        ("tokentrail-reason", dead.reason.encode()),
        ("tokentrail-detail", dead.detail.encode()[:4000]),
        ("tokentrail-source", f"{topic}/{partition}/{offset}".encode()),
    ]
