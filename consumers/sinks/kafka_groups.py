"""Grouped Kafka trainer sink: one JSON record per GRPO group, every member present, masked ones marked.

``GroupedKafkaSink`` (built-in name ``kafka-groups``) groups rebuilt rollouts by
the rule of ``consumers.sinks.grouping`` (the in-process stream's rule) and
writes each emitted group as one record on ``topic`` (default
``tokentrail.rebuilt-groups``, created by `tokentrail topics`), keyed by the UTF-8 group key (a group of one:
its rollout id), produced idempotently with ``acks=all``. The value is one
UTF-8 JSON object:

    {"format": "tokentrail.RolloutGroup", "format_version": 1, "key": ..., "size": 3,
     "complete": true, "timed_out": false, "missing": 0, "masked": ["r-b"],
     "rewarded": 2, "reward_mean": 0.5, "reward_std": 0.5, "members": [<record>, ...]}

where each member is the checked record exactly as the JSONL sink writes it
(``consumers.rebuild.to_json_line``), sorted by rollout id, masked members
included with ``mask_sample`` and their reasons. JSON rather than Avro: a
group is a container of records whose JSON form is already the checked,
documented, byte-deterministic output of the JSONL sink, and an Avro group
schema would nest ``RebuiltRollout`` and pin its evolution to this sink's
(``decode_group`` reads a value back and checks its format).

At-least-once: ``deliver(rollout)`` returns only once the record of the
rollout's group is acknowledged, so the consumer commits a member's offset only
after the whole group is durable; a failed write fails every member's delivery
(and every later one: the consumer stops, and a restart delivers from the last
commit). Readers deduplicate a group by its members' ``(snapshot_id,
version)``: after a crash a group can be written again. The consumer must keep
every member of the open groups in flight (``max_in_flight``, default 1024,
above the rollouts of all groups open at once) and the members of a group must
reach this consumer (one consumer, or a group's snapshots routed to one
partition). ``group_timeout_s`` (with ``on_timeout`` ``"emit"`` or ``"drop"``)
closes a group whose member never finishes, so a short group cannot hold the
consumer for ever; a dropped group's deliveries return (their offsets commit,
``dropped_groups`` counts them, and ``tokentrail replay`` can rebuild them).

A group larger than the topic's limit is sent without projections; if still too
large, its largest members are masked ``record_too_large`` and sent without
trajectory and detail, one at a time until it fits (the reward statistics are
recomputed without them); if nothing fits, ``TransportError``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from consumers.rebuild import to_json_line
from consumers.rebuild.validity import checked_record
from consumers.sinks.grouping import (
    GroupAssembler,
    GroupKey,
    GroupSize,
    OnTimeout,
    RewardOf,
    RolloutGroup,
    Step,
    expire_when_due,
)
from schemas.errors import TransportError
from schemas.kafka.bridge import AckedProducer
from schemas.kafka.config import producer_config
from schemas.kafka.framing import value_limit
from schemas.kafka.security import KafkaSecurity
from schemas.kafka.topics import MAX_MESSAGE_BYTES, REBUILT_GROUPS, key_for
from schemas.records import MaskCode, MaskReason, RebuiltRollout

__all__ = ["GROUP_FORMAT", "REBUILT_GROUPS", "GroupedKafkaSink", "decode_group", "encode_group"]

log = logging.getLogger("tokentrail.consumer.kafka_groups")

GROUP_FORMAT = "tokentrail.RolloutGroup"
GROUP_FORMAT_VERSION = 1
_RECENT = 100_000  # identities remembered to skip in-process redeliveries


def encode_group(group: RolloutGroup, *, include_response: bool = True) -> bytes:
    """The group's record value (module docstring); members spliced in as their JSONL lines, never re-parsed."""
    head = {"format": GROUP_FORMAT, "format_version": GROUP_FORMAT_VERSION, "key": group.key, "size": group.size,
            "complete": group.complete, "timed_out": group.timed_out, "missing": group.missing,
            "masked": list(group.masked), "rewarded": group.rewarded, "reward_mean": group.reward_mean,
            "reward_std": group.reward_std}
    text = json.dumps(head, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=str)
    members = b",".join(to_json_line(m, include_response=include_response).rstrip(b"\n") for m in group.members)
    return text[:-1].encode("utf-8") + b',"members":[' + members + b"]}"


def decode_group(value: bytes) -> dict[str, Any]:
    """A group record's value as a dict; ``TransportError`` naming what is wrong when it is not one."""
    try:
        record = json.loads(value)
    except ValueError as exc:
        raise TransportError(f"not a {GROUP_FORMAT} record: {exc}") from exc
    if not isinstance(record, dict) or record.get("format") != GROUP_FORMAT:
        found = record.get("format") if isinstance(record, dict) else type(record).__name__
        raise TransportError(f"not a {GROUP_FORMAT} record (format={found!r}): read it from the grouped sink's topic")
    return record


def _record_key(group: RolloutGroup) -> bytes:
    if group.key is None:
        return key_for(group.members[0].rollout_id)
    text = group.key if isinstance(group.key, str) else json.dumps(group.key, sort_keys=True, default=str)
    return key_for(text)


class GroupedKafkaSink:
    """``TrainerSink`` writing one Kafka record per group; ``deliver`` returns once its group's record is acked."""

    def __init__(self, bootstrap: str, topic: str = REBUILT_GROUPS, *, group_key: GroupKey = "group_id",
                 group_size: GroupSize = "group_size", reward: RewardOf = "reward",
                 group_timeout_s: float | None = None, on_timeout: OnTimeout = "emit",
                 include_response: bool = True, max_in_flight: int = 1024, delivery_timeout_s: float = 30.0,
                 max_message_bytes: int = MAX_MESSAGE_BYTES, clock: Callable[[], float] = time.monotonic,
                 security: KafkaSecurity | None = None) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight={max_in_flight}: must be >= 1")
        if value_limit(max_message_bytes) <= 0:
            raise ValueError(f"max_message_bytes={max_message_bytes}: leaves no room for a record after the "
                             f"framing headroom; use the topic's max.message.bytes (default {MAX_MESSAGE_BYTES})")
        self._assembler = GroupAssembler(group_key=group_key, group_size=group_size, reward=reward,
                                         group_timeout_s=group_timeout_s, on_timeout=on_timeout, clock=clock)
        self.topic = topic
        self.include_response = include_response
        self.max_in_flight = max_in_flight
        self.idempotent_across_restarts = False  # at-least-once on the topic: readers deduplicate
        self.max_message_bytes = max_message_bytes
        self._limit = value_limit(max_message_bytes)
        self.groups_written = 0
        self.projections_dropped = 0
        self.records_shrunk = 0
        self._pending: dict[tuple[str, int], asyncio.Future[None]] = {}
        self._recent: OrderedDict[tuple[str, int], None] = OrderedDict()
        self._writes: set[asyncio.Task[None]] = set()
        self._timer: asyncio.Task[None] | None = None
        self._failed: BaseException | None = None
        self._producer = AckedProducer(producer_config(bootstrap, delivery_timeout_ms=int(delivery_timeout_s * 1000),
                                                       max_message_bytes=max_message_bytes, security=security))

    @property
    def open_groups(self) -> int:
        return self._assembler.open_groups

    @property
    def dropped_groups(self) -> int:
        return self._assembler.dropped_groups

    async def deliver(self, rollout: RebuiltRollout) -> None:
        if self._failed is not None:
            raise TransportError(f"the grouped Kafka sink failed a group write earlier ({self._failed}); "
                                 "restart the consumer: it delivers again from the last commit") from self._failed
        rollout = checked_record(rollout)
        identity = (rollout.snapshot_id, rollout.version)
        if identity in self._recent:
            return
        future = self._pending.get(identity)
        if future is None:
            future = self._pending[identity] = asyncio.get_running_loop().create_future()
            self._apply(self._assembler.add(rollout))
            if self._assembler.next_deadline() is not None and (self._timer is None or self._timer.done()):
                self._timer = asyncio.get_running_loop().create_task(expire_when_due(self._assembler, self._apply))
        await asyncio.shield(future)

    def check_timeouts(self) -> None:
        """Apply the group timeout policy now (a timer does it too; each delivery does it first)."""
        self._apply(self._assembler.expire())

    def _apply(self, step: Step) -> None:
        for replaced in step.released:  # superseded by a newer version, which its group carries
            self._settle([replaced], remember=False)
        for group in step.dropped:
            self._settle(group, remember=True)
        for group in step.emitted:
            task = asyncio.get_running_loop().create_task(self._write(group))
            self._writes.add(task)
            task.add_done_callback(self._writes.discard)

    async def _write(self, group: RolloutGroup) -> None:
        # One task per group, so a cancelled deliver of the member that completed it cannot cancel the write.
        try:
            await self._producer.produce(self.topic, _record_key(group), self._encode(group))
        except asyncio.CancelledError:
            self._fail(group, TransportError(f"the write of group {group.key!r} was cancelled"))
            raise
        except Exception as exc:
            self._fail(group, exc)
            return
        self.groups_written += 1
        self._settle(group, remember=True)

    def _fail(self, group: RolloutGroup, exc: Exception) -> None:
        self._failed = exc
        for member in group:
            future = self._pending.pop((member.snapshot_id, member.version), None)
            if future is not None and not future.done():
                future.set_exception(exc)
                future.exception()  # retrieved here: a cancelled deliver must not leave it unhandled

    def _settle(self, members: Any, *, remember: bool) -> None:
        for member in members:
            identity = (member.snapshot_id, member.version)
            future = self._pending.pop(identity, None)
            if future is not None and not future.done():
                future.set_result(None)
            if remember:
                self._recent[identity] = None
        while len(self._recent) > _RECENT:
            self._recent.popitem(last=False)

    def _encode(self, group: RolloutGroup) -> bytes:
        data = encode_group(group, include_response=self.include_response)
        if len(data) > self._limit and self.include_response:
            log.warning("group %r: %d bytes with projections, over %d; sent without them", group.key, len(data),
                        self._limit)
            self.projections_dropped += 1
            data = encode_group(group, include_response=False)
        members = list(group.members)
        shrunk: set[str] = set()
        while len(data) > self._limit:
            sizes = {m.rollout_id: len(to_json_line(m, include_response=False)) for m in members
                     if m.rollout_id not in shrunk}
            if not sizes:
                raise TransportError(f"group {group.key!r} encodes to {len(data)} bytes even with every member "
                                     f"shrunk, over the {self._limit}-byte limit of {self.topic}: raise "
                                     "max.message.bytes on the topic and max_message_bytes of the sink")
            largest = max(sizes, key=lambda rid: sizes[rid])
            members = [self._shrunk(m, sizes[rid]) if (rid := m.rollout_id) == largest else m for m in members]
            shrunk.add(largest)
            group = self._regroup(group, members)
            data = encode_group(group, include_response=False)
        return data

    def _regroup(self, group: RolloutGroup, members: list[RebuiltRollout]) -> RolloutGroup:
        return self._assembler.summarize(group.key, group.size, members, timed_out=group.timed_out)

    def _shrunk(self, rollout: RebuiltRollout, size: int) -> RebuiltRollout:
        """The member masked and without trajectory and detail (the rollout-events topic keeps the evidence)."""
        log.warning("rollout %s: %d bytes, its group over %d; sent masked (record_too_large)", rollout.rollout_id,
                    size, self._limit)
        self.records_shrunk += 1
        reason = MaskReason(
            code=MaskCode.RECORD_TOO_LARGE,
            detail=(f"the rollout is {size} bytes and its group exceeds the {self._limit}-byte limit of "
                    f"{self.topic}; sent without its trajectory and detail. Raise max.message.bytes on the topic "
                    "and max_message_bytes of the sink, or use the JSONL sink; `tokentrail replay --rollout` "
                    "rebuilds it from rollout-events."))
        return dataclasses.replace(rollout, mask_sample=True, mask_reasons=[*rollout.mask_reasons, reason],
                                   trajectory=None, response_json=None,
                                   metrics=dataclasses.replace(rollout.metrics, detail_json="{}"))

    async def close(self) -> None:
        """Stop the timer, await writes under way, close the producer; deliveries still waiting fail."""
        if self._timer is not None:
            self._timer.cancel()
            with suppress(asyncio.CancelledError):
                await self._timer
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(TransportError("the grouped Kafka sink closed before this rollout's group "
                                                    "was complete; the consumer delivers it again"))
                future.exception()  # retrieved: a closed sink is not an unhandled error
        self._pending.clear()
        await self._producer.close()
