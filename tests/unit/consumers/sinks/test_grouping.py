"""The grouping rule (consumers.sinks.grouping) and the stream's grouped delivery built on it."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math

import pytest

from consumers.sinks.conformance import sample_rollout
from consumers.sinks.grouping import GroupAssembler, RolloutGroup
from consumers.sinks.stream import RolloutStream
from schemas.errors import ConfigError


def rollout(rid: str, version: int = 1, *, masked: bool = False, **result):
    return dataclasses.replace(sample_rollout(rid, version=version, masked=masked), result_json=json.dumps(result))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def assembler(**kwargs) -> GroupAssembler:
    return GroupAssembler(group_key="group_id", group_size="group_size", **kwargs)


def member(rid: str, reward, *, masked: bool = False, group: str = "g", size: int = 3, version: int = 1):
    return rollout(rid, version, masked=masked, group_id=group, group_size=size, reward=reward)


def test_a_group_with_a_masked_member_is_emitted_complete_with_the_member_marked():
    groups = assembler()
    assert groups.add(member("c", 1.0)).emitted == []
    assert groups.add(member("a", 0.0, masked=True)).emitted == []
    (group,) = groups.add(member("b", 0.5)).emitted
    assert isinstance(group, RolloutGroup) and group.complete and not group.timed_out and group.missing == 0
    assert [r.rollout_id for r in group] == ["a", "b", "c"] and len(group) == 3 and group[0].rollout_id == "a"
    assert group.masked == ("a",) and group.valid == (False, True, True) and group[0].mask_sample
    assert [r.rollout_id for r in group.valid_members] == ["b", "c"]
    # the masked member's reward (0.0) stays out of the baseline: mean/std over b and c only
    assert group.rewarded == 2 and group.reward_mean == pytest.approx(0.75) and group.reward_std == pytest.approx(0.25)
    assert groups.open_groups == 0


def test_reward_statistics_skip_non_numeric_rewards_and_are_none_without_any():
    groups = assembler()
    for rid, reward in (("a", "high"), ("b", True), ("c", None)):
        step = groups.add(member(rid, reward))
    (group,) = step.emitted
    assert group.complete and group.rewarded == 0 and group.reward_mean is None and group.reward_std is None
    one = assembler(reward=lambda r: json.loads(r.result_json)["score"])
    (solo,) = one.add(rollout("s", group_id="h", group_size=1, score=2)).emitted
    assert solo.reward_mean == 2.0 and solo.reward_std == 0.0  # population std of one value


def test_a_raising_reward_callable_counts_as_no_reward():
    groups = assembler(reward=lambda r: 1 / 0)
    (group,) = groups.add(member("a", 1.0, size=1)).emitted
    assert group.complete and group.reward_mean is None


def test_timeout_emit_yields_the_partial_group_incomplete_with_the_missing_count():
    clock = Clock()
    groups = assembler(group_timeout_s=30, on_timeout="emit", clock=clock)
    groups.add(member("a", 1.0))
    clock.now += 10
    groups.add(member("b", 0.0, masked=True))
    assert groups.next_deadline() == 1030.0
    clock.now += 19.9
    assert groups.expire().emitted == []
    clock.now += 0.1
    step = groups.expire()
    (group,) = step.emitted
    assert not group.complete and group.timed_out and group.missing == 1 and group.size == 3
    assert [r.rollout_id for r in group] == ["a", "b"] and group.masked == ("b",) and group.reward_mean == 1.0
    assert step.dropped == [] and groups.timed_out_groups == 1 and groups.dropped_groups == 0
    assert groups.open_groups == 0 and groups.next_deadline() is None


def test_timeout_drop_emits_nothing_and_counts_the_group():
    clock = Clock()
    groups = assembler(group_timeout_s=5, on_timeout="drop", clock=clock)
    groups.add(member("a", 1.0))
    clock.now += 5
    step = groups.add(member("x", 1.0, group="other", size=1))  # add applies the timeout first
    assert [g.key for g in step.emitted] == ["other"]
    (dropped,) = step.dropped
    assert dropped.key == "g" and [r.rollout_id for r in dropped] == ["a"] and groups.dropped_groups == 1


def test_a_member_arriving_after_its_group_was_emitted_is_alone_and_masked():
    clock = Clock()
    groups = assembler(group_timeout_s=5, clock=clock)
    groups.add(member("a", 1.0))
    clock.now += 6
    groups.expire()
    (late,) = groups.add(member("b", 1.0)).emitted
    assert late.key is None and len(late) == 1 and late.masked == ("b",)
    assert late[0].mask_reasons[-1].code == "invalid_group" and "already emitted" in late[0].mask_reasons[-1].detail
    assert groups.open_groups == 0  # it opened no new group under the spent key


def test_a_redelivered_member_replaces_the_version_it_had_and_releases_the_old_one():
    groups = assembler()
    groups.add(member("a", 0.0, size=2))
    step = groups.add(member("a", 1.0, size=2, version=2))
    assert [(r.rollout_id, r.version) for r in step.released] == [("a", 1)] and step.emitted == []
    (group,) = groups.add(member("b", 0.0, size=2)).emitted
    assert [(r.rollout_id, r.version) for r in group] == [("a", 2), ("b", 1)] and group.reward_mean == 0.5


def test_an_invalid_group_size_still_masks_invalid_group_alone():
    groups = assembler()
    (group,) = groups.add(rollout("a", group_id="g", group_size="two")).emitted
    assert group.key is None and group.complete and group.masked == ("a",)
    (reason,) = group[0].mask_reasons
    assert reason.code == "invalid_group" and "'two'" in reason.detail and "group_size='group_size'" in reason.detail
    assert groups.open_groups == 0


def test_a_member_whose_size_disagrees_stays_in_its_group_marked():
    groups = assembler()
    groups.add(member("a", 1.0, size=2))
    (group,) = groups.add(member("b", 0.0, size=3)).emitted
    assert group.size == 2 and group.complete and group.masked == ("b",) and group.reward_mean == 1.0
    assert "disagrees" in group[1].mask_reasons[-1].detail


def test_numeric_group_ids_are_keys_too_and_no_key_is_a_group_of_one():
    groups = assembler()
    (solo,) = groups.add(rollout("s")).emitted
    assert solo.key is None and solo.complete and solo.masked == ()
    (numbered,) = groups.add(rollout("n", group_id=7, group_size=1)).emitted
    assert numbered.key == "7"


@pytest.mark.parametrize("kwargs, match", [
    ({"group_timeout_s": 0}, "group_timeout_s=0"),
    ({"group_timeout_s": math.inf}, "group_timeout_s=inf"),
    ({"on_timeout": "wait"}, "on_timeout='wait'"),
    ({"reward": 3}, "reward=3"),
])
def test_settings_are_checked_naming_the_value(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        assembler(**kwargs)


# -- the stream -----------------------------------------------------------------------------------------------


async def test_the_stream_yields_a_group_with_a_masked_member_complete_and_marked():
    stream = RolloutStream(group_key="group_id", group_size="group_size")
    deliveries = [asyncio.create_task(stream.deliver(member(rid, reward, masked=rid == "b")))
                  for rid, reward in (("a", 1.0), ("b", 0.0), ("c", 0.0))]
    group = await asyncio.wait_for(stream.__anext__(), 1)
    assert isinstance(group, RolloutGroup) and group.complete and [r.rollout_id for r in group] == ["a", "b", "c"]
    assert group.masked == ("b",) and group[1].mask_sample and group.reward_mean == 0.5
    await asyncio.sleep(0.01)
    assert not any(d.done() for d in deliveries)  # the trainer holds the group
    stream.ack()
    await asyncio.wait_for(asyncio.gather(*deliveries), 1)


async def test_the_stream_times_a_group_out_by_the_injected_clock():
    clock = Clock()
    stream = RolloutStream(group_key="group_id", group_size="group_size", group_timeout_s=60, clock=clock)
    first = asyncio.create_task(stream.deliver(member("a", 1.0)))
    await asyncio.sleep(0)
    clock.now += 60
    stream.check_timeouts()
    group = await asyncio.wait_for(stream.__anext__(), 1)
    assert not group.complete and group.timed_out and group.missing == 2 and [r.rollout_id for r in group] == ["a"]
    stream.ack()
    await asyncio.wait_for(first, 1)
    await stream.close()


async def test_the_stream_drops_a_timed_out_group_and_releases_its_deliveries():
    clock = Clock()
    stream = RolloutStream(group_key="group_id", group_size="group_size", group_timeout_s=60, on_timeout="drop",
                           clock=clock)
    first = asyncio.create_task(stream.deliver(member("a", 1.0)))
    await asyncio.sleep(0)
    clock.now += 61
    stream.check_timeouts()
    await asyncio.wait_for(first, 1)  # released: the consumer may commit it
    assert stream.dropped_groups == 1 and stream._queue.empty()
    await asyncio.wait_for(stream.deliver(member("a", 1.0)), 1)  # a redelivery of it is a no-op
    assert stream._queue.empty()
    await stream.close()


async def test_the_stream_timer_closes_a_group_without_any_further_delivery():
    stream = RolloutStream(group_key="group_id", group_size="group_size", group_timeout_s=0.01)
    first = asyncio.create_task(stream.deliver(member("a", 1.0)))
    group = await asyncio.wait_for(stream.__anext__(), 5)  # only the timer can have emitted it
    assert group.timed_out and [r.rollout_id for r in group] == ["a"]
    stream.ack()
    await asyncio.wait_for(first, 1)
    await stream.close()


def test_a_timeout_without_grouping_is_refused():
    with pytest.raises(ConfigError, match="needs grouping"):
        RolloutStream(group_timeout_s=5)
