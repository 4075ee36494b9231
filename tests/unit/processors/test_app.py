"""The Faust shell on a real RocksDB store (rocksdict), driven by agent.test_context() (no broker).

The memory store never serialises values, so only a rocksdb:// test catches a
table that would mangle our raw Avro bytes.
"""

from __future__ import annotations

import pytest

from processors.app import create_app
from processors.settings import ProcessorSettings
from processors.state import header_codec, header_key
from schemas.codec import decode_snapshot, encode_event
from tests.factories import event, finished, make_call, retire


@pytest.fixture
def app(tmp_path):
    faust_app = create_app(ProcessorSettings(bootstrap="localhost:1", data_dir=tmp_path, app_id="unit-proc"))
    faust_app.finalize()
    faust_app.flow_control.resume()
    return faust_app


async def test_fold_agent_stores_raw_avro_state_in_rocksdb_and_emits_snapshots(app, monkeypatch):
    sent = []

    async def fake_send(self, key=None, value=None, **kw):
        sent.append((self.get_topic_name(), key, value))

        async def ack():
            return None

        return ack()

    monkeypatch.setattr(type(app.topic("x")), "send", fake_send)
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
