"""The Faust shell on a real RocksDB store (rocksdict), driven by agent.test_context() (no broker).

The memory store never serialises values, so only a rocksdb:// test catches a
table that would mangle our raw Avro bytes.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from processors.app import claim_local_state, create_app, release_local_state
from processors.delivery import ChangelogSend
from processors.settings import ProcessorSettings
from processors.state import header_codec, header_key
from schemas.codec import decode_snapshot, encode_event
from schemas.kafka.topics import MAX_MESSAGE_BYTES
from tests.factories import event, finished, make_call, retire


@pytest.fixture
def app(tmp_path):
    faust_app = create_app(ProcessorSettings(bootstrap="localhost:1", data_dir=tmp_path, app_id="unit-proc"))
    faust_app.finalize()
    faust_app.flow_control.resume()
    return faust_app


async def test_fold_agent_stores_raw_avro_state_in_rocksdb_and_emits_snapshots(app, monkeypatch):
    sent, changelog = [], []
    loop = asyncio.get_running_loop()

    def acked(result=None):
        fut = loop.create_future()
        fut.set_result(result)
        return fut

    async def fake_send(self, key=None, value=None, **kw):
        sent.append((self.get_topic_name(), key, value))
        return acked()

    async def fake_produce(batches):
        sends = []
        for batch in batches:
            changelog.extend((batch.partition, key, value) for key, value in batch.records)
            sends.append(ChangelogSend(batch.partition, len(batch.records), acked()))
        return sends

    monkeypatch.setattr(type(app.topic("x")), "send", fake_send)
    monkeypatch.setattr(app.tokentrail_table, "produce_changelog", fake_produce)
    monkeypatch.setattr(app.tokentrail_table, "mark_persisted", lambda futures: None)
    table = app.tokentrail_table
    assert type(table.data).__name__ == "Store" and "rocksdb" in type(table.data).__module__
    rid = "faust-r1"
    c1 = make_call([1, 2], [3])
    fold = app.agents["fold"]
    async with fold.test_context() as agent:
        await agent.put(encode_event(event(rid, c1)), key=rid.encode())
        await agent.put(encode_event(event(rid, finished())), key=rid.encode())
        header = header_codec().decode(table[header_key(rid)])
        assert header.frozen and header.n_calls == 1
        snaps = [decode_snapshot(v) for t, _, v in sent if t.endswith("snapshots")]
        assert len(snaps) == 1 and snaps[0].calls[0].call.model_call_id == c1.model_call_id
        await agent.put(encode_event(event(rid, retire(snaps[0].snapshot_id, snaps[0].version))), key=rid.encode())
        assert header_codec().decode(table[header_key(rid)]).retired
        await agent.put(b"not avro", key=rid.encode())
    assert any(t.endswith("deadletter") for t, _, _ in sent), "an undecodable record goes to the dead-letter topic"
    # every local write has its changelog record, in order; the retirement's deletes are tombstones
    assert [k[:1] for _, k, _ in changelog[:3]] == [b"c", b"s", b"h"]  # the capture: bodies, then its header
    assert any(v is None for _, _, v in changelog) and {p for p, _, _ in changelog} == {0}


def test_changelog_is_compacted_and_takes_the_topic_message_limit_rocksdb_memory_is_bounded(app):
    table = app.tokentrail_table
    changelog = table.changelog_topic
    assert changelog.compacting is True
    assert changelog.config["max.message.bytes"] == str(MAX_MESSAGE_BYTES)
    # Compaction needs closed segments: at most 16 MiB or 10 minutes each, so a recovery reads little more
    # than the live state (the soak's hour left 643,000 records in Kafka's default 1 GiB segment).
    assert int(changelog.config["segment.bytes"]) == MAX_MESSAGE_BYTES
    assert int(changelog.config["segment.ms"]) <= 10 * 60 * 1000
    assert app.conf.producer_max_request_size == MAX_MESSAGE_BYTES
    assert app.conf.consumer_max_fetch_size == MAX_MESSAGE_BYTES
    # faust's default is a 2 GiB block cache per partition DB
    assert table.options["block_cache_size"] == ProcessorSettings(bootstrap="x:1").rocksdb.block_cache_size <= 64 << 20


def test_local_tables_left_by_an_unclean_stop_are_discarded_for_changelog_recovery(app):
    tabledir = Path(app.conf.tabledir)
    tabledir.mkdir(parents=True)
    (tabledir / "rollout-state-0.db").write_text("local writes the changelog may lack")
    assert claim_local_state(app) is False, "a first start keeps what is there"
    assert not release_local_state(app), "a worker that did not stop cleanly keeps its marker"
    assert claim_local_state(app) is True and not tabledir.exists()
    tabledir.mkdir(parents=True)
    app.stopped_cleanly = True
    assert release_local_state(app)
    assert claim_local_state(app) is False and tabledir.exists()


async def test_an_event_is_acked_only_once_kafka_has_its_changelog_records_and_outputs(app, monkeypatch):
    """faust may commit past changelog records it has not sent (its flush gives up after 0.1 s);
    the agent produces them itself and acks by hand, in order, once Kafka has them."""
    produced: list[list[asyncio.Future]] = []
    snapshot_acks: list[asyncio.Future] = []
    loop = asyncio.get_running_loop()

    async def fake_send(self, key=None, value=None, **kw):
        snapshot_acks.append(loop.create_future())
        return snapshot_acks[-1]

    async def fake_produce(batches):
        produced.append([loop.create_future() for batch in batches for _ in batch.records])
        return [ChangelogSend(0, 1, future) for future in produced[-1]]

    monkeypatch.setattr(type(app.topic("x")), "send", fake_send)
    table = app.tokentrail_table
    monkeypatch.setattr(table, "produce_changelog", fake_produce)
    monkeypatch.setattr(table, "mark_persisted", lambda futures: None)
    rid = "faust-ack"
    async with app.agents["fold"].test_context() as agent:
        first = await agent.put(encode_event(event(rid, make_call([1], [2]))), key=rid.encode())
        second = await agent.put(encode_event(event(rid, finished())), key=rid.encode())
        await asyncio.sleep(0.05)
        assert [len(f) for f in produced] == [3, 1]  # body, seq, header; then the frozen header
        assert len(snapshot_acks) == 1 and not first.message.acked and not second.message.acked
        for fut in produced[1]:
            fut.set_result(None)
        await asyncio.sleep(0.05)
        assert not second.message.acked, "acks keep the processing order"
        for fut in produced[0]:
            fut.set_result(None)
        await asyncio.sleep(0.05)
        assert first.message.acked and not second.message.acked, "the snapshot is not acknowledged yet"
        snapshot_acks[0].set_result(None)
        await asyncio.sleep(0.05)
        assert second.message.acked
        assert app.acker.idle


async def test_the_table_manager_starts_what_faust_starts_without_its_one_second_sleep(app, monkeypatch):
    from processors.app import DeclaredTables

    tables = app.tables
    assert isinstance(tables, DeclaredTables)
    started = []

    async def no_sleep(seconds):  # Faust's own on_start sleeps 1 s here: every worker start and restart
        raise AssertionError(f"slept {seconds} s")

    async def update_channels():
        started.append("channels")

    async def recovery_start():
        started.append("recovery")

    monkeypatch.setattr(tables, "sleep", no_sleep)
    monkeypatch.setattr(tables, "_update_channels", update_channels)
    monkeypatch.setattr(tables.recovery, "start", recovery_start)
    await tables.on_start()
    assert started == ["channels", "recovery"]


async def test_the_worker_closes_its_loop_without_mode_s_one_second_sentinel(app, monkeypatch):
    from processors.app import ProcessorWorker

    worker = ProcessorWorker(app, loglevel="WARNING")
    assert worker.spinner is None  # faust's spinner would set the root logger to DEBUG
    slept = []
    real_sleep = asyncio.sleep

    async def sleep(seconds, *args):
        slept.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    await worker._sentinel_task()
    assert slept == [0]
