"""The in-process async iterator sink, with and without GRPO-style grouping."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from consumers.sinks.conformance import sample_rollout
from consumers.sinks.stream import RolloutStream
from schemas.errors import ConfigError


def rollout(rid: str, version: int = 1, **result):
    return dataclasses.replace(sample_rollout(rid, version=version), result_json=json.dumps(result))


async def test_deliver_returns_only_once_the_trainer_moved_past_the_rollout():
    stream = RolloutStream()
    delivery = asyncio.create_task(stream.deliver(rollout("a")))
    got = await asyncio.wait_for(stream.__anext__(), 1)
    assert got.rollout_id == "a"
    await asyncio.sleep(0.01)
    assert not delivery.done()  # the trainer holds it, has not moved on
    nxt = asyncio.create_task(stream.__anext__())
    await asyncio.wait_for(delivery, 1)  # asking for the next item acknowledges "a"
    nxt.cancel()


async def test_redelivery_of_an_acknowledged_rollout_is_a_no_op():
    stream = RolloutStream()
    delivery = asyncio.create_task(stream.deliver(rollout("a")))
    await stream.__anext__()
    stream.ack()
    await delivery
    await asyncio.wait_for(stream.deliver(rollout("a")), 1)
    assert stream._queue.empty()


async def test_groups_are_yielded_when_complete_members_sorted():
    stream = RolloutStream(group_key="group_id", group_size="n")
    deliveries = [asyncio.create_task(stream.deliver(rollout(rid, group_id=g, n=n)))
                  for rid, g, n in (("b", 1, 2), ("x", 2, 3), ("a", 1, 2), ("y", 2, 3))]
    group = await asyncio.wait_for(stream.__anext__(), 1)
    assert [r.rollout_id for r in group] == ["a", "b"] and stream.open_groups == 1
    stream.ack()
    await asyncio.wait_for(asyncio.gather(deliveries[0], deliveries[2]), 1)
    assert not deliveries[1].done()
    solo = asyncio.create_task(stream.deliver(rollout("solo")))  # no group key: a group of one
    single = await asyncio.wait_for(stream.__anext__(), 1)
    assert [r.rollout_id for r in single] == ["solo"]
    for task in (*deliveries, solo):
        task.cancel()


async def test_a_redelivered_newer_version_replaces_the_member():
    stream = RolloutStream(group_key=lambda r: "g", group_size=2)
    old = asyncio.create_task(stream.deliver(rollout("a", 1)))
    await asyncio.sleep(0)
    new = asyncio.create_task(stream.deliver(rollout("a", 2)))
    other = asyncio.create_task(stream.deliver(rollout("b", 1)))
    group = await asyncio.wait_for(stream.__anext__(), 1)
    assert [(r.rollout_id, r.version) for r in group] == [("a", 2), ("b", 1)]
    await asyncio.wait_for(old, 1)  # superseded: released
    stream.ack()
    await asyncio.wait_for(asyncio.gather(new, other), 1)


async def test_close_ends_iteration_and_fails_untaken_deliveries():
    stream = RolloutStream()
    delivery = asyncio.create_task(stream.deliver(rollout("a")))
    await asyncio.sleep(0)
    await stream.close()
    with pytest.raises(ConfigError, match="closed before"):
        await delivery
    items = [r async for r in stream]
    assert [r.rollout_id for r in items] == ["a"]  # already queued: still handed out
    with pytest.raises(StopAsyncIteration):
        await stream.__anext__()


def test_grouping_settings_are_checked():
    with pytest.raises(ConfigError, match="go together"):
        RolloutStream(group_key="g")
    with pytest.raises(ConfigError, match=">= 1"):
        RolloutStream(group_key="g", group_size=0)


async def test_a_bad_group_size_masks_that_rollout_alone_with_a_clear_message():
    # A record's content never stops the stream (it used to raise, stopping the consumer for good).
    stream = RolloutStream(group_key="g", group_size="n")
    delivery = asyncio.create_task(stream.deliver(rollout("a", g=1, n="two")))
    (got,) = await asyncio.wait_for(stream.__anext__(), 1)
    assert got.rollout_id == "a" and got.mask_sample
    (reason,) = got.mask_reasons
    assert reason.code == "invalid_group" and "'two'" in reason.detail and "not a positive integer" in reason.detail
    assert "group_size='n'" in reason.detail
    stream.ack()
    await asyncio.wait_for(delivery, 1)
