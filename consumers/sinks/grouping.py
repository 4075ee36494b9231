"""GRPO groups a trainer can trust: the one grouping rule of the in-process stream and the grouped Kafka sink (pure).

``GroupAssembler`` takes rebuilt rollouts one at a time and says, as a
``Step``, which groups are ready. A ready ``RolloutGroup`` holds every member
that arrived, sorted by rollout id, **masked members included and marked**
(``group.masked`` names them; each keeps ``mask_sample=True`` and its
reasons): a trainer leaves them out of its baseline instead of receiving a
group that silently shrank (NeMo RL #4061: a dropped member turns a group of
four into a group of three whose advantages no longer mean what they say).
``reward_mean`` / ``reward_std`` (population std) are over the *valid*
(unmasked) members whose reward is a finite number; ``None`` when there is none.

The rule, in one place:

- the key and the size come from the finish result (``group_key="group_id"``
  and ``group_size="group_size"`` name keys of it) or from callables;
  ``group_size`` may be a constant. A rollout without a key is a group of one.
- A group is emitted when ``size`` distinct rollout ids of its key are there
  (``complete=True``). A redelivered member (another ``(snapshot_id,
  version)`` of the same rollout id) replaces the one it had; the replaced one
  is in ``Step.released`` (it will never be emitted).
- A rollout whose group cannot be told (its size is not a positive integer, a
  key or size callable raised or returned something unhashable) is emitted
  alone, masked ``invalid_group`` naming the value and the setting. So is a
  member whose size disagrees with the size its group opened with (kept in its
  group, marked) and a member arriving after its group was emitted (alone,
  masked ``invalid_group``: its group's baseline is already spent). A record's
  content never stops the assembler.
- Timeout policy (``group_timeout_s``; ``None``: wait for ever): a group still
  incomplete ``group_timeout_s`` after its first member arrived is closed by
  ``expire()`` (``add`` calls it first, too). ``on_timeout="emit"`` emits it
  with what arrived, ``complete=False``, ``timed_out=True`` and
  ``missing`` = how many never came (their ids are not known: only the size
  is); ``on_timeout="drop"`` emits nothing, puts it in ``Step.dropped`` (its
  members' deliveries are released so the consumer goes on) and counts it in
  ``dropped_groups``. Time is the injected ``clock`` (``time.monotonic`` by
  default), so tests need no sleeps. Its members are not masked by the
  timeout: their data is sound, the group is short, and ``complete`` says so.

``expire_when_due`` is the timer the sinks run in their event loop, so a group
whose missing member never finishes is closed even when no delivery arrives
(the consumer stops sending once its ``max_in_flight`` deliveries are pending).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import statistics
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, overload

from schemas.errors import ConfigError
from schemas.records import MaskCode, MaskReason, RebuiltRollout

__all__ = ["GroupAssembler", "GroupKey", "GroupSize", "OnTimeout", "RewardOf", "RolloutGroup", "Step",
           "expire_when_due", "result_of"]

log = logging.getLogger("tokentrail.consumer.grouping")

GroupKey = str | Callable[[RebuiltRollout], Hashable | None]
GroupSize = int | str | Callable[[RebuiltRollout], int]
RewardOf = str | Callable[[RebuiltRollout], float | None]
OnTimeout = Literal["emit", "drop"]
ON_TIMEOUT = ("emit", "drop")
_CLOSED_MEMORY = 100_000  # keys of emitted groups remembered, to tell a late member


@dataclass(frozen=True)
class RolloutGroup(Sequence[RebuiltRollout]):
    """One group as a trainer receives it; also a read-only sequence of its members (``for r in group``).

    ``members``: every member that arrived, sorted by rollout id, masked ones included.
    ``masked``: the rollout ids of the masked members (``mask_sample``), in member order.
    ``complete``: ``size`` members are there. ``timed_out``: closed by the timeout policy,
    ``missing`` members never came. ``rewarded``: how many valid members had a numeric reward
    (the n of ``reward_mean`` / ``reward_std``).
    """

    key: Hashable | None
    size: int
    members: tuple[RebuiltRollout, ...]
    complete: bool
    masked: tuple[str, ...] = ()
    timed_out: bool = False
    missing: int = 0
    reward_mean: float | None = None
    reward_std: float | None = None
    rewarded: int = 0

    @property
    def valid(self) -> tuple[bool, ...]:
        """One flag per member, in member order: True when it may enter the baseline."""
        return tuple(not m.mask_sample for m in self.members)

    @property
    def valid_members(self) -> tuple[RebuiltRollout, ...]:
        return tuple(m for m in self.members if not m.mask_sample)

    @overload
    def __getitem__(self, index: int) -> RebuiltRollout: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[RebuiltRollout, ...]: ...

    def __getitem__(self, index: int | slice) -> Any:
        return self.members[index]

    def __len__(self) -> int:
        return len(self.members)

    def __iter__(self) -> Iterator[RebuiltRollout]:
        return iter(self.members)


@dataclass
class Step:
    """What one ``add`` / ``expire`` decided: groups to hand on, groups dropped, superseded versions."""

    emitted: list[RolloutGroup] = field(default_factory=list)
    dropped: list[RolloutGroup] = field(default_factory=list)
    released: list[RebuiltRollout] = field(default_factory=list)

    def merge(self, other: Step) -> Step:
        self.emitted += other.emitted
        self.dropped += other.dropped
        self.released += other.released
        return self


@dataclass
class _Open:
    size: int
    opened_at: float
    members: dict[str, RebuiltRollout] = field(default_factory=dict)


class GroupAssembler:
    """The grouping rule (module docstring). Not thread-safe: one event loop drives it."""

    def __init__(self, *, group_key: GroupKey, group_size: GroupSize, reward: RewardOf = "reward",
                 group_timeout_s: float | None = None, on_timeout: OnTimeout = "emit",
                 clock: Callable[[], float] = time.monotonic) -> None:
        if isinstance(group_size, bool) or (isinstance(group_size, int) and group_size < 1):
            raise ConfigError(f"group_size={group_size!r}: must be >= 1 (or name a key of the finish result)")
        if not (isinstance(group_size, (int, str)) or callable(group_size)):
            raise ConfigError(f"group_size={group_size!r}: must be an int >= 1, a result key or a callable")
        if not (isinstance(group_key, str) or callable(group_key)):
            raise ConfigError(f"group_key={group_key!r}: must name a key of the finish result or be a callable")
        if not (isinstance(reward, str) or callable(reward)):
            raise ConfigError(f"reward={reward!r}: must name a key of the finish result or be a callable")
        if group_timeout_s is not None and not (isinstance(group_timeout_s, (int, float))
                                                and math.isfinite(group_timeout_s) and group_timeout_s > 0):
            raise ConfigError(f"group_timeout_s={group_timeout_s!r}: must be a number of seconds > 0, "
                              "or None to wait for every member for ever")
        if on_timeout not in ON_TIMEOUT:
            raise ConfigError(f"on_timeout={on_timeout!r}: must be one of {list(ON_TIMEOUT)} ('emit' the partial "
                              "group marked complete=False, or 'drop' it)")
        self.group_key, self.group_size, self.reward = group_key, group_size, reward
        self.group_timeout_s, self.on_timeout, self.clock = group_timeout_s, on_timeout, clock
        self.dropped_groups = 0
        self.timed_out_groups = 0
        self._open: dict[Hashable, _Open] = {}
        self._closed: OrderedDict[Hashable, None] = OrderedDict()

    @property
    def open_groups(self) -> int:
        return len(self._open)

    def next_deadline(self) -> float | None:
        """When the oldest open group times out (``clock`` time); None without a timeout or open group."""
        if self.group_timeout_s is None or not self._open:
            return None
        return min(g.opened_at for g in self._open.values()) + self.group_timeout_s

    def add(self, rollout: RebuiltRollout) -> Step:
        """Admit one (checked) rollout; timed-out groups are closed first."""
        step = self.expire()
        try:
            key = self._key_of(rollout)
        except Exception as exc:  # fail closed: this rollout alone, masked; the assembler goes on
            return step.merge(self._alone(rollout, f"{exc}"))
        if key is None:
            return step.merge(Step(emitted=[self.summarize(None, 1, [rollout])]))
        if key in self._closed:
            return step.merge(self._alone(rollout, f"its group {key!r} was already emitted (complete, timed out or "
                                                   "dropped) without it, and a late member has no baseline",
                                          fix="Raise group_timeout_s if members legitimately finish this late"))
        try:
            size = self._size_of(rollout)
        except Exception as exc:
            return step.merge(self._alone(rollout, f"{exc}"))
        group = self._open.get(key)
        if group is None:
            group = self._open[key] = _Open(size=size, opened_at=self.clock())
        elif size != group.size:
            rollout = _masked(rollout, f"rollout {rollout.rollout_id}: group size {size} disagrees with the size "
                                       f"{group.size} its group {key!r} opened with; kept in the group, marked. "
                                       "Every member's finish result must carry the same group size")
        replaced = group.members.get(rollout.rollout_id)
        if replaced is not None and _identity(replaced) != _identity(rollout):
            step.released.append(replaced)
        group.members[rollout.rollout_id] = rollout
        if len(group.members) >= group.size:
            step.emitted.append(self._close(key, timed_out=False))
        return step

    def expire(self) -> Step:
        """Close every open group past ``group_timeout_s`` by the ``on_timeout`` policy."""
        step = Step()
        if self.group_timeout_s is None:
            return step
        now = self.clock()
        for key in [k for k, g in self._open.items() if now - g.opened_at >= self.group_timeout_s]:
            group = self._close(key, timed_out=True)
            self.timed_out_groups += 1
            if self.on_timeout == "emit":
                log.warning("group %r timed out after %.1f s with %d of %d members; emitted incomplete",
                            key, self.group_timeout_s, len(group), group.size)
                step.emitted.append(group)
            else:
                self.dropped_groups += 1
                log.warning("group %r timed out after %.1f s with %d of %d members; dropped (%d dropped so far)",
                            key, self.group_timeout_s, len(group), group.size, self.dropped_groups)
                step.dropped.append(group)
        return step

    def summarize(self, key: Hashable | None, size: int, members: Sequence[RebuiltRollout], *,
                  timed_out: bool = False) -> RolloutGroup:
        """The ``RolloutGroup`` of ``members`` (sorted here), marks and reward statistics computed."""
        ordered = tuple(sorted(members, key=lambda m: m.rollout_id))
        rewards = [r for r in (self._reward_of(m) for m in ordered if not m.mask_sample) if r is not None]
        return RolloutGroup(
            key=key, size=size, members=ordered, complete=len(ordered) >= size, timed_out=timed_out,
            masked=tuple(m.rollout_id for m in ordered if m.mask_sample), missing=max(0, size - len(ordered)),
            reward_mean=statistics.fmean(rewards) if rewards else None,
            reward_std=statistics.pstdev(rewards) if rewards else None, rewarded=len(rewards))

    # -- internals --------------------------------------------------------------------
    def _close(self, key: Hashable, *, timed_out: bool) -> RolloutGroup:
        group = self._open.pop(key)
        self._closed[key] = None
        while len(self._closed) > _CLOSED_MEMORY:
            self._closed.popitem(last=False)
        return self.summarize(key, group.size, list(group.members.values()), timed_out=timed_out)

    def _alone(self, rollout: RebuiltRollout, why: str, *,
               fix: str = "Fix the finish result (or the group_key / group_size settings of the sink)") -> Step:
        log.warning("rollout %s: %s; emitted alone, masked (invalid_group)", rollout.rollout_id, why)
        masked = _masked(rollout, f"{why}; emitted as a group of one. {fix}")
        return Step(emitted=[self.summarize(None, 1, [masked])])

    def _key_of(self, rollout: RebuiltRollout) -> Hashable | None:
        if callable(self.group_key):
            key = self.group_key(rollout)
            hash(key)  # an unhashable key is this rollout's problem, not the assembler's
            return key
        value = result_of(rollout).get(self.group_key)
        if value is None or isinstance(value, str):
            return value
        return json.dumps(value, sort_keys=True)  # a number or object id: its canonical text

    def _size_of(self, rollout: RebuiltRollout) -> int:
        size: object = self.group_size
        if callable(size):
            size = size(rollout)
        elif isinstance(size, str):
            size = result_of(rollout).get(size)
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ConfigError(f"rollout {rollout.rollout_id}: group size {size!r} is not a positive integer "
                              f"(group_size={self.group_size!r}; the finish result must carry it as an integer "
                              ">= 1)")
        return size

    def _reward_of(self, rollout: RebuiltRollout) -> float | None:
        try:
            value = self.reward(rollout) if callable(self.reward) else result_of(rollout).get(self.reward)
        except Exception as exc:  # no reward, not a stopped sink
            log.warning("rollout %s: the reward callable raised %s: %s; counted as no reward",
                        rollout.rollout_id, type(exc).__name__, exc)
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return None
        return float(value)


def result_of(rollout: RebuiltRollout) -> dict[str, Any]:
    """The finish result as a dict (``{}`` when it is not a JSON object)."""
    try:
        value = json.loads(rollout.result_json)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


async def expire_when_due(assembler: GroupAssembler, apply: Callable[[Step], None]) -> None:
    """Close groups as their deadlines pass (``apply`` each ``Step``); returns once no group is open."""
    while (deadline := assembler.next_deadline()) is not None:
        await asyncio.sleep(max(0.0, deadline - assembler.clock()))
        apply(assembler.expire())


def _identity(rollout: RebuiltRollout) -> tuple[str, int]:
    return rollout.snapshot_id, rollout.version


def _masked(rollout: RebuiltRollout, detail: str) -> RebuiltRollout:
    reason = MaskReason(code=MaskCode.INVALID_GROUP, detail=detail)
    return dataclasses.replace(rollout, mask_sample=True, mask_reasons=[*rollout.mask_reasons, reason])
