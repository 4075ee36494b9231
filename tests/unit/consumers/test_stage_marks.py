"""The consumer's opt-in stage marks (``schemas.stage_log``, for ``tokentrail bench e2e``) and its fetch wait."""

from __future__ import annotations

import consumers.loop as loop_module
from consumers.settings import ConsumerSettings
from schemas.kafka.config import DEFAULT_FETCH_WAIT_MS, consumer_config
from schemas.stage_log import StageLog, read_stage_log
from tests.unit.consumers.fakes import RecordingSink
from tests.unit.consumers.test_loop import clean, consumer_for

CONSUMER_STAGES = ["snapshot.record", "cons.polled", "cons.rebuilt", "cons.delivered", "cons.retired",
                   "cons.committed"]


async def test_each_rollout_is_marked_at_every_consumer_stage_in_order(tmp_path, monkeypatch):
    path = tmp_path / "stages.jsonl"
    monkeypatch.setattr(loop_module, "STAGES", StageLog(path))
    consumer, *_ = consumer_for(RecordingSink(), [clean("r-1"), clean("r-2")])
    await consumer.run(max_rollouts=2)
    lines = path.read_text().splitlines()
    marks = read_stage_log(lines)
    assert sorted(marks) == ["r-1", "r-2"]
    for rid, stages in marks.items():
        assert list(stages) == CONSUMER_STAGES, rid
        assert stages["snapshot.record"] == 1_700_000_000.0  # the record's own Kafka timestamp, in seconds
        times = [stages[s] for s in CONSUMER_STAGES[1:]]
        assert times == sorted(times)
    assert len(lines) == 2 * len(CONSUMER_STAGES)  # one mark each: nothing else is written


async def test_off_the_consumer_writes_no_marks(tmp_path, monkeypatch):
    log = StageLog(None)
    monkeypatch.setattr(loop_module, "STAGES", log)
    consumer, *_ = consumer_for(RecordingSink(), [clean("r-1")])
    stats = await consumer.run(max_rollouts=1)
    assert stats.delivered == 1 and log.on is False and list(tmp_path.iterdir()) == []


def test_the_fetch_wait_reaches_the_client_config():
    assert ConsumerSettings(bootstrap="k:9092").fetch_wait_ms == DEFAULT_FETCH_WAIT_MS
    assert consumer_config("k:9092", "g")["fetch.wait.max.ms"] == DEFAULT_FETCH_WAIT_MS
    assert consumer_config("k:9092", "g", fetch_wait_ms=20)["fetch.wait.max.ms"] == 20
