"""Kill -9 the broker in the middle of concurrent rollouts, restart it: every acknowledged call
reaches the topic exactly once (by event id), in per-rollout order, and nothing lost is delivered
unmasked. The interceptor spools (fsync) while Kafka is down and drains in order afterwards."""

from __future__ import annotations

import asyncio
import re
import threading
import time
import uuid

import confluent_kafka
import httpx
import pytest

from compose.harnesses.sdk import run_rollout
from compose.rig.kafka.broker import FAST_RESTART, kill_broker, restart_broker, start_broker, stop_broker
from compose.rig.stack import LocalStack
from schemas.codec import decode_event
from schemas.ids import call_id_from_response_id
from schemas.records import CallCaptured

pytestmark = [pytest.mark.integration, pytest.mark.real_broker]

# Per engine: rollouts, calls per rollout, seconds between rollout starts. The crafted vLLM agent
# answers after two tool calls and in milliseconds, so its rollouts start one by one across the
# outage instead of all running through it.
PLANS = {"reference": (8, 6, 0.0), "vllm": (24, 3, 0.25)}
# The reference engine's emulated decode: ~20 tokens a call at 40 ms is ~1 s a call, so its 6-call
# rollouts run through the whole outage (at 4 ms they could all end before the kill, 1 s in).
REFERENCE_DECODE_MS = "40"


@pytest.fixture(scope="module")
def crashable(tmp_path_factory, kafka_flavor):
    """A broker of this module's own, killed and restarted by each test (its topics are the test's own):
    one broker start (~10 s) for both engines."""
    if kafka_flavor not in ("jar", "external"):
        pytest.skip("needs a jar broker this test can kill and restart")
    state = tmp_path_factory.mktemp("crashable") / "kafka"
    info = start_broker(state, properties=FAST_RESTART)
    yield state, info.bootstrap
    stop_broker(state)


def _topic_calls(bootstrap: str, topic: str) -> list[tuple[str, str, str]]:
    """(event_id, rollout_id, model_call_id) of every CallCaptured, in partition order."""
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    out, idle = [], 0
    while idle < 6:
        msg = consumer.poll(0.5)
        if msg is None:
            idle += 1
            continue
        idle = 0
        if msg.error():
            continue
        ev = decode_event(msg.value())
        if isinstance(ev.body, CallCaptured):
            out.append((ev.event_id, ev.rollout_id, ev.body.model_call_id))
    consumer.close()
    return out


def test_acknowledged_calls_survive_a_broker_crash_exactly_once_in_order(crashable, tmp_path, upstream):
    state, bootstrap = crashable
    tag = uuid.uuid4().hex[:6]
    rollouts, calls, stagger = PLANS["reference" if upstream is None else "vllm"]
    stack = LocalStack(bootstrap, tmp_path / "run", topic_prefix=f"crash{tag}.", processor_id=f"crash{tag}",
                       policy_args=("--decode-ms-per-token", REFERENCE_DECODE_MS), upstream_url=upstream,
                       intercept_args=("--spool-dir", str(tmp_path / "spool"), "--publish-timeout-ms", "2000"))
    with stack:
        # Steady state before the fault: one rollout delivered end to end proves the processor
        # holds its partitions and the consumer is past its start-up checks (a broker killed
        # during either is another test's subject, not this one's).
        warm = asyncio.run(run_rollout(stack.capture_base_url(f"warm-{tag}"), f"warm-{tag}", "warm up"))
        stack.finish(warm.rollout_id, {"reward": 1.0}, final_response_id=warm.final_response_id,
                     final_text=warm.final_text)
        stack.wait_rollouts([warm.rollout_id], timeout=90)
        ids = [f"crash-{tag}-{i}" for i in range(rollouts)]
        outcomes: dict[str, object] = {}

        async def one(i: int, rid: str):
            await asyncio.sleep(i * stagger)
            return await run_rollout(stack.capture_base_url(rid), rid, f"task {i}", tool_calls=calls - 1,
                                     max_turns=calls + 2)

        def run_all() -> None:
            async def go():
                return await asyncio.gather(*(one(i, r) for i, r in enumerate(ids)))
            for o in asyncio.run(go()):
                outcomes[o.rollout_id] = o

        harness = threading.Thread(target=run_all)
        harness.start()
        time.sleep(1.0)  # rollouts are mid-way
        kill_broker(state)
        time.sleep(5.0)  # calls keep being answered: durable in the spool
        restart_broker(state)
        harness.join(180)
        assert not harness.is_alive()
        for o in outcomes.values():
            stack.finish(o.rollout_id, {"reward": 1.0}, final_response_id=o.final_response_id, final_text=o.final_text)
        for _ in range(300):
            if httpx.get(f"{stack.interceptor_url}/healthz", timeout=5).json()["spooled"] == 0:
                break
            time.sleep(0.2)
        spooled = httpx.get(f"{stack.interceptor_url}/metrics", timeout=5).text
        records = stack.wait_rollouts(ids, timeout=120)

    (count,) = re.findall(r"^tokentrail_events_spooled_total (\S+)$", spooled, re.M)
    assert float(count) > 0, "the crash was not exercised: nothing was spooled"
    acked = {o.rollout_id: [call_id_from_response_id(i) for i in o.response_ids] for o in outcomes.values()}
    on_topic = _topic_calls(bootstrap, stack.topics.rollout_events)
    event_ids = [e for e, _, _ in on_topic]
    assert len(event_ids) == len(set(event_ids)), "an event reached the topic twice"
    for rid in ids:
        assert outcomes[rid].error is None, outcomes[rid].error  # the spool kept every call answerable
        order = [call for _, r, call in on_topic if r == rid]
        assert order == acked[rid] and len(order) == calls, f"{rid}: topic {order} vs acknowledged {acked[rid]}"
        assert records[rid]["mask_sample"] is False, records[rid]["mask_reasons"]
