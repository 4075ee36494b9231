"""Cost guards: deterministic counts of the work per event and per batch, so a change that adds work back fails.

No timing: each test counts calls (spies) while folding a small workload, the way the worker does.

Per event (the pure fold): a capture is decoded once, by the compiled reader (never by the full
decoder), its body stored as it arrived (never re-encoded), its rollout's header rebuilt once and
encoded once. Per batch (the Faust shell, on a real RocksDB store): one RocksDB write per partition,
one changelog record per state write, in write order, sent as record batches (no per-record send),
one acker entry and one ack per event, sends only for snapshots and dead letters.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

import processors.decode as decode_module
import processors.fold as fold_module
import processors.txn as txn_module
from processors.app import create_app
from processors.delivery import OrderedAcker, StateBatch
from processors.fold import fold_raw
from processors.fold_loop import FoldLoop
from processors.guard import OffsetGuard
from processors.replay import MemoryState, replay
from processors.settings import ProcessorSettings
from schemas.codec import encode_event
from schemas.event_bytes import event_body_bytes
from schemas.records import CallCaptured
from tests.factories import event, finished, started
from tests.unit.processors.scenarios import realistic_rollout

ROLLOUTS = ("cost-a", "cost-b", "cost-c")
N_CALLS = 6


def workload() -> list[tuple[bytes, bytes]]:
    """Three verified delta chains (an intent, six captures, a finish each), interleaved."""
    per_rollout = []
    for rid in ROLLOUTS:
        calls = realistic_rollout(N_CALLS, 600)
        evs = [event(rid, started(calls[0].model_call_id)), *(event(rid, c) for c in calls), event(rid, finished())]
        per_rollout.append([(rid.encode(), encode_event(e)) for e in evs])
    return [record for group in zip(*per_rollout) for record in group]


def is_capture(value: bytes) -> bool:
    return type(decode_module.decode_event_with_body(value)[0].body) is CallCaptured


class Count:
    """A spy: counts the calls of ``fn`` and passes them on."""

    def __init__(self, fn):
        self.fn, self.n = fn, 0

    def __call__(self, *args, **kwargs):
        self.n += 1
        return self.fn(*args, **kwargs)


@pytest.fixture
def records():
    return workload()


def test_a_capture_is_decoded_once_by_the_compiled_reader_and_never_by_the_full_decoder(records, monkeypatch):
    captures = sum(is_capture(v) for _, v in records)
    plan = decode_module._plan()
    read = Count(plan.read)
    full = Count(decode_module.decode_event_with_body)
    monkeypatch.setattr(plan, "read", read)
    monkeypatch.setattr(decode_module, "decode_event_with_body", full)
    steps = list(replay(records, offsets_from=0))
    assert all(not s.result.deadletters for s in steps)
    assert read.n == captures == len(ROLLOUTS) * N_CALLS
    assert full.n == len(records) - captures, "the full decode serves only the intents and finishes"


def test_an_unchanged_call_body_is_stored_as_it_arrived_never_re_encoded(records, monkeypatch):
    encode = Count(fold_module.encode_call_body)
    monkeypatch.setattr(fold_module, "encode_call_body", encode)
    for (_, value), step in zip(records, replay(records, offsets_from=0)):
        if is_capture(value):
            stored = [v for k, v in step.result.writes.items() if k.startswith(b"c\x00")]
            assert len(stored) == 1 and stored[0].endswith(event_body_bytes(value))
    assert encode.n == 0


def test_a_state_change_rebuilds_its_header_once_and_encodes_it_once(records, monkeypatch):
    rebuild = Count(fold_module.replace_header)
    encode = Count(txn_module.encode_header)
    monkeypatch.setattr(fold_module, "replace_header", rebuild)
    monkeypatch.setattr(txn_module, "encode_header", encode)
    steps = list(replay(records, offsets_from=0))
    changed = sum(1 for s in steps if s.result.changed)
    assert changed == len(records)  # every event of this workload changes its rollout
    assert encode.n == changed
    assert rebuild.n == changed, "one rebuild per event: the position goes into the new header, not a second copy"


# ---------------------------------------------------------------- the shell, per batch


class FakeBuilder:
    """aiokafka's BatchBuilder as the changelog producer uses it; full after ``capacity`` records."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.records, self.closed = capacity, [], False

    def append(self, *, key, value, timestamp):
        if len(self.records) >= self.capacity and self.records:
            return None
        self.records.append((key, value))
        return object()

    def close(self):
        self.closed = True

    def record_count(self):
        return len(self.records)


class FakeProducer:
    """The aiokafka producer under faust's: record batches sent with create_batch/send_batch."""

    def __init__(self, capacity: int = 10_000) -> None:
        self.capacity, self.batches, self.offsets = capacity, [], {}

    def create_batch(self):
        return FakeBuilder(self.capacity)

    async def send_batch(self, builder, topic, *, partition):
        assert builder.closed, "a batch goes out complete, without lingering"
        base = self.offsets.get(partition, 0)
        self.offsets[partition] = base + builder.record_count()
        self.batches.append((partition, builder.records))
        future = asyncio.get_running_loop().create_future()
        future.set_result(SimpleNamespace(offset=base))
        return future


def message(key: bytes, value: bytes, partition: int, offset: int) -> SimpleNamespace:
    return SimpleNamespace(key=key, value=value, partition=partition, offset=offset, topic="rollout-events",
                           tp=("rollout-events", partition), generation_id=0, timestamp=0.0)


@pytest.fixture
def shell(tmp_path, monkeypatch):
    app = create_app(ProcessorSettings(bootstrap="localhost:1", data_dir=tmp_path, app_id="unit-costs"))
    app.finalize()
    table = app.tokentrail_table
    producer = FakeProducer(capacity=7)
    monkeypatch.setattr(app.producer, "_producer", producer, raising=False)
    sends = []

    async def topic_send(self, key=None, value=None, **kw):
        sends.append((self.get_topic_name(), key))
        future = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future

    monkeypatch.setattr(type(app.topic("x")), "send", topic_send)
    writes = Count(StateBatch.write)
    monkeypatch.setattr(StateBatch, "write", lambda batch: writes(batch))
    return SimpleNamespace(app=app, table=table, producer=producer, sends=sends, writes=writes)


async def test_a_batch_writes_each_partition_once_and_logs_one_record_per_write_in_batches(shell, records):
    app, table, producer = shell.app, shell.table, shell.producer
    acked: list[int] = []
    acker = OrderedAcker(app, table, ack=lambda m: acked.append(m.offset))
    submits = Count(acker.submit)
    acker.submit = submits  # type: ignore[method-assign]
    loop = FoldLoop(table, acker, OffsetGuard(app, "rollout-events"), app.topic("snapshots"),
                    app.topic("deadletter"), max_batch=10)
    partition_of = {rid.encode(): i % 2 for i, rid in enumerate(ROLLOUTS)}  # two partitions
    messages = [message(k, v, partition_of[k], i) for i, (k, v) in enumerate(records)]
    acker.start()
    try:
        await loop.fold(messages)  # one fetch of 24 events: chunks of 10, 10 and 4
        await asyncio.sleep(0.05)
    finally:
        acker.stop()
    chunks = [messages[i:i + 10] for i in range(0, len(messages), 10)]
    partitions_per_chunk = [len({m.partition for m in chunk}) for chunk in chunks]
    assert shell.writes.n == sum(partitions_per_chunk), "one RocksDB write per partition per batch"
    assert submits.n == len(chunks) and acked == [m.offset for m in messages], "one acker entry per batch"
    # The changelog: exactly the fold's writes (what replay computes), one record each, in write order.
    expected: dict[int, list] = {0: [], 1: []}
    state, writes_per_event = MemoryState(), []
    for m in messages:  # the pure fold at the same positions
        result = fold_raw(state, m.key, m.value, position=(m.partition, m.offset))
        state.apply(result)
        expected[m.partition] += list(result.writes.items())
        writes_per_event.append(len(result.writes))
    logged: dict[int, list] = {0: [], 1: []}
    for partition, batch in producer.batches:
        logged[partition] += batch
        assert 1 <= len(batch) <= producer.capacity
    assert logged == expected
    records_per_chunk = [sum(writes_per_event[i:i + 10]) for i in range(0, len(records), 10)]
    full_batches = sum(-(-n // producer.capacity) for n in records_per_chunk)
    assert len(producer.batches) <= full_batches + sum(partitions_per_chunk), "record batches, not records"
    assert shell.sends == [("snapshots", rid.encode()) for rid in ROLLOUTS], "sends: the snapshots, nothing else"
    assert table.take_changelog() == [], "nothing went through faust's per-write changelog path"
