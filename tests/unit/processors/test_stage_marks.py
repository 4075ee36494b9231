"""The fold agent's opt-in stage marks (``schemas.stage_log``, for ``tokentrail bench e2e``) and its fetch wait."""

from __future__ import annotations

import asyncio

import processors.fold_loop as loop_module
from processors.app import create_app
from processors.delivery import ChangelogSend
from processors.settings import ProcessorSettings
from schemas.codec import encode_event
from schemas.stage_log import StageLog, read_stage_log
from tests.factories import event, finished, make_call
from tests.unit.processors.test_app import app  # noqa: F401  (the fixture)

PROCESSOR_STAGES = ["finish.record", "proc.fetched", "proc.folded", "proc.sent", "proc.changelog_acked",
                    "proc.snapshot_acked"]


async def test_a_finish_is_marked_at_every_processor_stage_and_a_capture_is_not(app, tmp_path, monkeypatch):  # noqa: F811
    path = tmp_path / "stages.jsonl"
    monkeypatch.setattr(loop_module, "STAGES", StageLog(path))
    loop = asyncio.get_running_loop()
    snapshot_acks: list[asyncio.Future] = []
    changelog_acks: list[asyncio.Future] = []

    async def fake_send(self, key=None, value=None, **kw):
        snapshot_acks.append(loop.create_future())
        return snapshot_acks[-1]

    async def fake_produce(batches):
        sends = [ChangelogSend(batch.partition, len(batch.records), loop.create_future()) for batch in batches]
        changelog_acks.extend(send.future for send in sends)
        return sends

    monkeypatch.setattr(type(app.topic("x")), "send", fake_send)
    monkeypatch.setattr(app.tokentrail_table, "produce_changelog", fake_produce)
    monkeypatch.setattr(app.tokentrail_table, "mark_persisted", lambda futures: None)
    rid = "faust-marks"
    async with app.agents["fold"].test_context() as agent:
        await agent.put(encode_event(event(rid, make_call([1], [2]))), key=rid.encode())
        await agent.put(encode_event(event(rid, finished())), key=rid.encode())
        await asyncio.sleep(0.05)
        assert list(read_stage_log(path.read_text().splitlines())[rid]) == PROCESSOR_STAGES[:4]  # no acks yet
        for fut in (*changelog_acks, *snapshot_acks):
            fut.set_result(None)
        await asyncio.sleep(0.05)
    lines = path.read_text().splitlines()
    stages = read_stage_log(lines)[rid]
    assert list(stages) == PROCESSOR_STAGES and len(lines) == len(PROCESSOR_STAGES)  # the capture marked nothing
    times = [stages[s] for s in PROCESSOR_STAGES[1:]]
    assert times == sorted(times)


async def test_the_worker_consumer_long_polls_at_most_the_setting(tmp_path):
    worker_app = create_app(ProcessorSettings(bootstrap="localhost:1", data_dir=tmp_path, fetch_wait_ms=40))
    thread = worker_app.consumer._thread
    client = thread._create_worker_consumer(thread.transport)  # what the consumer thread builds at start
    try:
        assert client._fetch_max_wait_ms == 40  # faust's own would be 1500
    finally:
        await client.stop()
