"""A stalled engine and a harness that leaves, through real processes on a real broker: the reference
engine, the interceptor (short stream timeouts), the processor and the rebuild consumer.

- A rollout finished while its call is stalled is delivered masked (the call's CallStarted intent, durable
  before dispatch, has no capture: ``intent_without_capture``), never unmasked without the call; the
  harness still gets its error event within ``--stream-idle-timeout-s``.
- A rollout finished after the stall timed out is masked with ``engine_timeout`` (the CallIncomplete was
  durable before the harness heard of the timeout).
- A harness that leaves mid-stream leaves CallIncomplete(client_disconnected): its rollout is masked.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import httpx
import pytest

from compose.rig.stack import LocalStack

pytestmark = [pytest.mark.integration, pytest.mark.real_broker]

IDLE_S = 2.0
STALL = "[[fault:stall]]"  # the reference engine sends 4 chunks, then hangs until the client goes


@pytest.fixture(scope="module")
def stalling_stack(kafka_bootstrap, tmp_path_factory):
    tag = uuid.uuid4().hex[:8]
    with LocalStack(kafka_bootstrap, tmp_path_factory.mktemp("stall"), topic_prefix=f"its{tag}.",
                    processor_id=f"its{tag}",
                    intercept_args=("--stream-idle-timeout-s", str(IDLE_S), "--engine-timeout-s", "60")) as stack:
        yield stack


async def _turn(stack: LocalStack, rid: str, content: str, *, leave_after: int | None = None,
                stream: bool = True, streaming: asyncio.Event | None = None) -> tuple[list[str], float]:
    """One call of rollout ``rid``: the SSE data lines it got (leaving after ``leave_after``), and how long.

    ``streaming`` is set once two events arrived (the engine is in the middle of its answer)."""
    body = {"model": "m", "messages": [{"role": "user", "content": content}], "stream": stream}
    url = f"{stack.capture_base_url(rid)}/chat/completions"
    t0 = time.monotonic()
    async with httpx.AsyncClient(timeout=60, headers={"authorization": f"Bearer {stack.api_key(rid)}"}) as client:
        if not stream:
            r = await client.post(url, json=body)
            assert r.status_code == 200, r.text
            return [], time.monotonic() - t0
        async with client.stream("POST", url, json=body) as r:
            lines = []
            async for line in r.aiter_lines():
                if line.startswith("data:"):
                    lines.append(line)
                    if streaming is not None and len(lines) == 2:
                        streaming.set()
                if leave_after is not None and len(lines) >= leave_after:
                    break  # closing the stream early closes the connection: the client is gone
    return lines, time.monotonic() - t0


def _incomplete_count(stack: LocalStack, reason: str) -> float:
    text = httpx.get(f"{stack.interceptor_url}/metrics", timeout=10).text
    needle = f'tokentrail_calls_incomplete_total{{reason="{reason}"}} '
    return next((float(line.split()[-1]) for line in text.splitlines() if line.startswith(needle)), 0.0)


def _capture_reason(record: dict) -> str:
    assert record["mask_sample"] is True, record["mask_reasons"]
    (reason,) = [r for r in record["mask_reasons"] if r["code"] == "capture_incomplete"]
    return reason["detail"]


async def test_a_rollout_finished_while_its_call_is_stalled_is_delivered_masked(stalling_stack):
    stack, rid = stalling_stack, f"stalled-{uuid.uuid4().hex[:6]}"
    await _turn(stack, rid, "weather in Oslo?", stream=False)
    streaming = asyncio.Event()
    stalled = asyncio.create_task(_turn(stack, rid, f"and in Bergen? {STALL}", streaming=streaming))
    await asyncio.wait_for(streaming.wait(), 30)
    await asyncio.sleep(0.3)  # the engine has stalled; the harness waits on it
    assert not stalled.done()
    await asyncio.to_thread(stack.finish, rid, {"reward": 1.0})  # the trainer gives up on it
    lines, took = await stalled
    assert "[DONE]" not in lines[-1] and "stream_idle_timeout_s=2" in lines[-1]
    assert took < IDLE_S + 10, f"the harness waited {took:.1f} s"
    record = (await asyncio.to_thread(stack.wait_rollouts, [rid], 90))[rid]
    assert "intent_without_capture" in _capture_reason(record)


async def test_a_rollout_finished_after_the_stall_timed_out_is_masked_with_engine_timeout(stalling_stack):
    stack, rid = stalling_stack, f"timedout-{uuid.uuid4().hex[:6]}"
    await _turn(stack, rid, "weather in Oslo?", stream=False)
    lines, took = await _turn(stack, rid, f"and in Bergen? {STALL}")
    assert "[DONE]" not in lines[-1] and '"engine_timeout"' in lines[-1] and took < IDLE_S + 10
    await asyncio.to_thread(stack.finish, rid, {"reward": 1.0})
    record = (await asyncio.to_thread(stack.wait_rollouts, [rid], 90))[rid]
    detail = _capture_reason(record)
    assert detail.startswith("engine_timeout") and "intent_without_capture" not in detail
    assert record["_ng_token_capture"]["n_calls"] == 1  # the first call's capture is there


async def test_a_harness_that_leaves_mid_stream_masks_its_rollout(stalling_stack):
    stack, rid = stalling_stack, f"gone-{uuid.uuid4().hex[:6]}"
    before = _incomplete_count(stack, "client_disconnected")
    await _turn(stack, rid, "weather in Oslo?", stream=False)
    lines, _ = await _turn(stack, rid, f"and in Bergen? {STALL}", leave_after=2)
    assert len(lines) == 2
    for _ in range(100):  # the interceptor records it once it sees the connection close
        if _incomplete_count(stack, "client_disconnected") > before:
            break
        await asyncio.sleep(0.05)
    await asyncio.to_thread(stack.finish, rid, {"reward": 1.0})
    record = (await asyncio.to_thread(stack.wait_rollouts, [rid], 90))[rid]
    detail = _capture_reason(record)
    assert detail.startswith("client_disconnected") and "intent_without_capture" not in detail


def test_positions_show_each_stage_caught_up_once_rollouts_are_delivered(stalling_stack):
    """What a failed wait prints: every partition's end offset beside its group's commit."""
    stack = stalling_stack
    rid = f"pos-{uuid.uuid4().hex[:6]}"
    asyncio.run(_turn(stack, rid, "weather in Oslo?", stream=False))
    stack.finish(rid, {"reward": 1.0})
    stack.wait_rollouts([rid], 90)

    def caught_up(positions) -> bool:  # an empty partition has no commit (-1001)
        return all(done == end or (end == 0 and done < 0) for parts in positions.values()
                   for end, done in parts.values())

    deadline, positions = time.monotonic() + 60, {}
    while time.monotonic() < deadline:  # both groups commit after their work, not with it
        positions = stack.positions()
        if caught_up(positions):
            break
        time.sleep(0.5)
    events, snapshots = positions[stack.topics.rollout_events], positions[stack.topics.snapshots]
    assert sum(end for end, _ in snapshots.values()) >= 1 and sum(end for end, _ in events.values()) >= 3
    assert caught_up(positions), positions
