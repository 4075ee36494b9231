"""Conformance kit for trainer sinks: ``await run_conformance(factory, read_back=...)``.

Checks that a third-party ``TrainerSink`` honours the contract the consumer
relies on. ``factory()`` returns a fresh sink over the same backend (a new
process would construct one the same way); ``read_back()``, when given, returns
what the backend durably holds, as ``RebuiltRollout`` records, JSON dicts (with
``snapshot_id`` and ``version``) or ``(snapshot_id, version)`` pairs. Without
``read_back`` the checks that need to look inside the backend are skipped. A
sink whose deduplication lives only as long as its process (the in-process
stream; the Kafka sink, whose readers deduplicate) declares
``idempotent_across_restarts = False`` and skips the restart check.

Returns the names of the checks that passed; raises ``SinkConformanceError``
naming the first failing check. Every sink it creates is closed.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from consumers.sinks.plugin import TrainerSink, check_sink_class
from schemas.errors import ConfigError, TokentrailError
from schemas.records import (
    CallSpan,
    CaptureMetrics,
    IncompleteReason,
    MaskCode,
    MaskReason,
    RebuiltRollout,
    TerminalAttribution,
    Trajectory,
)

Factory = Callable[[], TrainerSink | Awaitable[TrainerSink]]
ReadBack = Callable[[], Iterable[Any] | Awaitable[Iterable[Any]]]


class SinkConformanceError(TokentrailError):
    def __init__(self, check: str, detail: str) -> None:
        super().__init__(f"sink conformance check {check!r} failed: {detail}")
        self.check = check
        self.detail = detail


async def run_conformance(factory: Factory, *, read_back: ReadBack | None = None, timeout_s: float = 30.0,
                          rollout_prefix: str = "conformance") -> list[str]:
    """Run every applicable check; see the module docstring."""
    kit = _Kit(factory, read_back, timeout_s, rollout_prefix)
    try:
        return await kit.run()
    finally:
        await kit.close_all()


class _Kit:
    def __init__(self, factory: Factory, read_back: ReadBack | None, timeout_s: float, prefix: str) -> None:
        self.factory, self.read_back, self.timeout_s, self.prefix = factory, read_back, timeout_s, prefix
        self.sinks: list[TrainerSink] = []
        self.passed: list[str] = []

    async def run(self) -> list[str]:
        sink = await self.check("protocol", self._protocol)
        clean = sample_rollout(f"{self.prefix}-clean", version=3)
        await self.check("deliver_returns", lambda: self.deliver(sink, clean))
        if self.read_back:
            await self.check("durable_when_deliver_returns", lambda: self.expect({_identity(clean): 1}))
        masked = sample_rollout(f"{self.prefix}-masked", masked=True)
        await self.check("masked_without_trajectory", lambda: self.deliver(sink, masked))
        await self.check("idempotent_redelivery", lambda: self._redeliver(sink, clean))
        newer = sample_rollout(clean.rollout_id, version=clean.version + 2)
        await self.check("newer_version_delivered", lambda: self._newer(sink, clean, newer))
        big = sample_rollout(f"{self.prefix}-large", tokens=131_072)
        await self.check("large_rollout", lambda: self.deliver(sink, big))
        if getattr(sink, "max_in_flight", 1) > 1:
            await self.check("concurrent_deliveries", lambda: self._concurrent(sink))
        await self.check("close_idempotent", lambda: self._close_twice(sink))
        if self.read_back and getattr(sink, "idempotent_across_restarts", True):
            await self.check("restart_idempotent", lambda: self._restart(clean))
        return self.passed

    async def check(self, name: str, fn: Callable[[], Awaitable[Any]]) -> Any:
        try:
            result = await fn()
        except SinkConformanceError as exc:
            raise SinkConformanceError(name, exc.detail) from exc
        except Exception as exc:  # any unexpected exception fails the check, named
            raise SinkConformanceError(name, f"{type(exc).__name__}: {exc}") from exc
        self.passed.append(name)
        return result

    async def new_sink(self) -> TrainerSink:
        sink = self.factory()
        if inspect.isawaitable(sink):
            sink = await sink
        self.sinks.append(sink)
        return sink

    async def deliver(self, sink: TrainerSink, rollout: RebuiltRollout) -> None:
        try:
            await asyncio.wait_for(sink.deliver(rollout), self.timeout_s)
        except TimeoutError as exc:
            raise SinkConformanceError("deliver", f"deliver did not return within {self.timeout_s:.0f} s") from exc

    async def held(self) -> Counter:
        result = self.read_back()  # type: ignore[misc]
        if inspect.isawaitable(result):
            result = await result
        return Counter(_identity(item) for item in result)

    async def expect(self, wanted: dict[tuple[str, int], int]) -> None:
        held = await self.held()
        wrong = {k: (held.get(k, 0), n) for k, n in wanted.items() if held.get(k, 0) != n}
        if wrong:
            raise SinkConformanceError("read_back", "held/expected copies: " + ", ".join(
                f"{sid}@v{v}: {got}/{want}" for (sid, v), (got, want) in sorted(wrong.items())))

    async def _protocol(self) -> TrainerSink:
        sink = await self.new_sink()
        try:
            check_sink_class(type(sink), type(sink).__name__)
        except ConfigError as exc:
            raise SinkConformanceError("protocol", str(exc)) from exc
        if not isinstance(sink, TrainerSink):
            raise SinkConformanceError("protocol", "the factory's object is not a TrainerSink")
        return sink

    async def _redeliver(self, sink: TrainerSink, rollout: RebuiltRollout) -> None:
        await self.deliver(sink, rollout)
        if self.read_back:
            await self.expect({_identity(rollout): 1})

    async def _newer(self, sink: TrainerSink, old: RebuiltRollout, new: RebuiltRollout) -> None:
        await self.deliver(sink, new)
        if self.read_back:
            await self.expect({_identity(old): 1, _identity(new): 1})

    async def _concurrent(self, sink: TrainerSink) -> None:
        batch = [sample_rollout(f"{self.prefix}-concurrent-{i}") for i in range(8)]
        await asyncio.gather(*(self.deliver(sink, r) for r in batch))
        if self.read_back:
            await self.expect({_identity(r): 1 for r in batch})

    async def _close_twice(self, sink: TrainerSink) -> None:
        await asyncio.wait_for(sink.close(), self.timeout_s)
        await asyncio.wait_for(sink.close(), self.timeout_s)

    async def _restart(self, rollout: RebuiltRollout) -> None:
        fresh = await self.new_sink()
        await self.deliver(fresh, rollout)
        await self.expect({_identity(rollout): 1})

    async def close_all(self) -> None:
        for sink in self.sinks:
            try:
                await asyncio.wait_for(sink.close(), self.timeout_s)
            except Exception:  # the failing check already says what went wrong
                pass


def _identity(item: Any) -> tuple[str, int]:
    if isinstance(item, RebuiltRollout):
        return (item.snapshot_id, item.version)
    if isinstance(item, dict):
        return (str(item["snapshot_id"]), int(item["version"]))
    snapshot_id, version = item
    return (str(snapshot_id), int(version))


def sample_rollout(rollout_id: str, *, version: int = 1, masked: bool = False, tokens: int = 12) -> RebuiltRollout:
    """A valid RebuiltRollout for checks: ``tokens`` ids, half prompt, half generated, one call."""
    trajectory = None
    if not masked:
        prompt = tokens // 2
        ids = [(7 * i) % 50_000 for i in range(tokens)]
        trajectory = Trajectory(token_ids=ids, loss_mask=bytes(prompt) + b"\x01" * (tokens - prompt),
                                log_probs=[-0.25] * (tokens - prompt), prompt_len=prompt,
                                spans=[CallSpan(model_call_id="c" * 32, start=0, generation_start=prompt, end=tokens,
                                                policy_version="v1")])
    generated = 0 if masked else tokens - tokens // 2
    snapshot_id = hashlib.sha256(f"{rollout_id}\0{version}".encode()).hexdigest()[:32]
    return RebuiltRollout(
        rollout_id=rollout_id, snapshot_id=snapshot_id, version=version, mask_sample=masked,
        mask_reasons=[MaskReason(code=MaskCode.CAPTURE_INCOMPLETE, detail=IncompleteReason.UPSTREAM_ERROR)] if masked else [],
        trajectory=trajectory, response_json=None, result_json='{"reward": 1.0}',
        metrics=CaptureMetrics(
            n_calls=1, roots=1, chains=1, delivered_fraction=0.0 if masked else 1.0, quarantined_calls=0,
            quarantined_fraction=0.0, empty_generation_calls=0, unresolved_parent_calls=0, parent_link_failures={},
            generated_tokens_captured=generated, generated_tokens_delivered=generated, capture_incomplete=masked,
            terminal_attribution=TerminalAttribution(chain="main", method="declared", call_id="c" * 32)),
    )
