"""Events → real ``tokentrail process`` worker → rebuild consumer → in-process trainer, on a real broker.

A Claude Code-style rollout (Anthropic Messages, streamed, a title call on a
small model, an abandoned mid-rollout retry) rebuilds unmasked with the title
call excluded and the retry quarantined; the same rollout whose final call was
retried and that declares no terminal is masked with the reason. What the live
pipeline delivers is byte-identical to rebuilding a locally folded snapshot.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import confluent_kafka
import pytest

from consumers.gym.adapters import TokenSink, TokenSource
from consumers.gym.conformance import gym_entry
from consumers.rebuild import rebuild
from consumers.replay.eventlog import EventLog
from processors.replay import MemoryState, replay
from schemas.codec import decode_snapshot, encode_rebuilt
from schemas.ids import response_id
from schemas.kafka.topics import key_for
from schemas.records import Dialect, RetireRequested
from tests.factories import event, finished
from tests.integration.consumers.delivery import consume
from tests.unit.consumers.support import child, root, snapshot_of, text_call

pytestmark = [pytest.mark.integration, pytest.mark.real_broker]

SESSION = {"dialect": Dialect.ANTHROPIC_MESSAGES, "streamed": True, "user_agent": "claude-cli/2.0.14 (external, cli)"}


def cc(model: str, tools: bool = True, **kw):
    return {"requested_model": model, "facts": {**SESSION, "tools_present": tools, "harness_session_id": kw.pop(
        "session", "s-1")}, **kw}


def claude_code_rollout(final_retry: bool):
    """title (haiku, no tools) + c1 → [c2a abandoned | c2b] → c3 (or two retried finals c3a/c3b)."""
    sonnet = "claude-sonnet-4-5-20250929"
    title = root(range(900, 930), range(40, 52), **cc("claude-haiku-4-5-20251001", tools=False))
    c1 = root(range(100, 160), range(200, 220), **cc(sonnet))
    c2a = child(c1, range(300, 315), range(400, 418), **cc(sonnet))
    c2b = child(c1, range(300, 315), range(500, 522), **cc(sonnet))
    if not final_retry:
        c3 = text_call(child(c2b, range(600, 610), range(700, 730), **cc(sonnet)), "Oslo: 14 degrees and clear.")
        return [title, c1, c2a, c2b, c3], c3
    c3a = child(c2b, range(600, 610), range(700, 730), **cc(sonnet))
    c3b = child(c2b, range(600, 610), range(800, 830), **cc(sonnet))
    return [title, c1, c2a, c2b, c3a, c3b], None


async def test_claude_code_style_rollouts_through_the_live_pipeline(kafka_bootstrap, topics, publisher, processor):
    tag = uuid.uuid4().hex[:6]
    good_id, retried_id = f"cc-{tag}-good", f"cc-{tag}-final-retry"
    good_calls, terminal = claude_code_rollout(final_retry=False)
    retried_calls, _ = claude_code_rollout(final_retry=True)
    good_finish = finished({"reward": 1.0}, final_response_id=response_id("msg_", terminal.model_call_id),
                           final_text="Oslo: 14 degrees and clear.")
    events = [event(good_id, c) for c in good_calls] + [event(good_id, good_finish)]
    events += [event(retried_id, c) for c in retried_calls] + [event(retried_id, finished({"reward": 0.0}))]
    publisher.publish(events)

    got = await consume(kafka_bootstrap, topics, {good_id, retried_id})

    good = got[good_id]
    title, c1, c2a, c2b, c3 = good_calls
    m = good.metrics
    assert good.mask_sample is False and good.mask_reasons == []
    assert [s.model_call_id for s in good.trajectory.spans] == [c1.model_call_id, c2b.model_call_id, c3.model_call_id]
    assert m.side_calls_excluded == 1 and m.quarantined_calls == 1
    detail = json.loads(m.detail_json)
    assert [s["call_id"] for s in detail["side_calls"]] == [title.model_call_id]
    assert detail["quarantined_call_ids"] == [c2a.model_call_id]
    assert (m.terminal_attribution.method, m.terminal_attribution.call_id) == ("declared", c3.model_call_id)
    assert json.loads(good.result_json) == {"reward": 1.0}
    assert json.loads(good.response_json)["usage"]["output_tokens"] == 20 + 22 + 30

    retried = got[retried_id]
    assert retried.mask_sample is True
    (reason,) = retried.mask_reasons
    c3a, c3b = retried_calls[4:]
    assert reason.code == "unresolved_retry" and reason.call_ids == sorted([c3a.model_call_id, c3b.model_call_id])
    assert retried.metrics.side_calls_excluded == 1

    # Live equals replay: the same events folded here rebuild to the same bytes.
    local = snapshot_of(*good_calls, finish=good_finish, rollout=good_id)
    assert encode_rebuilt(rebuild(local)) == encode_rebuilt(good)

    # The consumer retired exactly the snapshot it delivered, and the fold accepted it.
    assert _header(kafka_bootstrap, topics.rollout_events, good_id).retired
    # A masked rollout is retired too, yet its evidence stays in the log: replay rebuilds the same record.
    assert _header(kafka_bootstrap, topics.rollout_events, retried_id).retired
    assert encode_rebuilt(_replay(kafka_bootstrap, topics.rollout_events, retried_id)) == encode_rebuilt(retried)


def _replay(bootstrap: str, topic: str, rollout_id: str):
    """Fold the rollout's logged events up to its freeze, as replay does, and rebuild."""
    log = EventLog(bootstrap, topic)
    try:
        for step in replay(log.rollout_events(rollout_id), key=key_for(rollout_id)):
            if step.snapshots:
                return rebuild(step.snapshots[-1])
        raise AssertionError(f"no freeze of {rollout_id} in the log")
    finally:
        log.close()


def _header(bootstrap: str, topic: str, rollout_id: str):
    log = EventLog(bootstrap, topic)
    try:
        state = MemoryState()
        records = list(log.rollout_events(rollout_id))
        for _ in replay(records, state=state, key=key_for(rollout_id)):
            pass
        assert isinstance(records[-1].decode().body, RetireRequested)
        header = state.header(rollout_id)
        assert header is not None
        return header
    finally:
        log.close()


async def test_gym_source_freeze_equals_the_live_processors_snapshot(kafka_bootstrap, topics, processor):
    rid = f"gym-live-{uuid.uuid4().hex[:6]}"
    sink, source = TokenSink(kafka_bootstrap, topic=topics.rollout_events), \
        TokenSource(kafka_bootstrap, topic=topics.rollout_events)
    try:
        first = gym_entry(rid, "call-1", [11, 12], [13, 14])
        await sink.put(first)
        second = {**gym_entry(rid, "call-2", [11, 12, 13, 14, 15], [16]), "parent_call_id": "call-1",
                  "parent_resolution": "resolved"}
        await sink.put(second)
        await sink.mark_incomplete(rid, "call-3")
        frozen = await source.freeze(rid)
    finally:
        await sink.close()
        await source.close()
    live = await asyncio.to_thread(_live_snapshot, kafka_bootstrap, topics.snapshots, rid)
    assert (frozen.snapshot_id, frozen.version, frozen.incomplete) == (live.snapshot_id, live.version, True)
    assert [e["model_call_id"] for e in frozen.entries] == [sc.call.model_call_id for sc in live.calls]


def _live_snapshot(bootstrap: str, topic: str, rollout_id: str, timeout: float = 60.0):
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": f"itc-{uuid.uuid4().hex}",
                                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error() and msg.key() == key_for(rollout_id):
                return decode_snapshot(msg.value())
        raise AssertionError(f"the processor emitted no snapshot of {rollout_id} within {timeout} s")
    finally:
        consumer.close()
