"""NeMo Gym's transport conformance checks, run against any ``TokenSink``/``TokenSource`` pair.

The checks of Gym's ``run_conformance(sink_factory, source_factory,
lineage_factory=None, rollout_id=...)`` (gym_inventory §6.5), with Gym's inputs:
factories return fresh clients over one shared backend; each check uses its own
rollout id ``<rollout_id>-<check>``; entries are built like Gym's capture does
(ROOT, ``created_at=1700000000.0``, request ``[user: "What is the weather in
Paris?"]``). Returns the names of the checks that passed; raises
``GymConformanceError(check, detail)`` on the first failure (any unexpected
exception fails the check). Every client is closed. ``begin_call_custody`` runs
only when the sink has ``begin_call``.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Any

from schemas.errors import TokentrailError
from schemas.hashing import assistant_fingerprint, compute_digest, conversation_digest

REQUEST = [{"role": "user", "content": "What is the weather in Paris?"}]
OUTPUT = [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "It is sunny."}]}]


class GymConformanceError(TokentrailError):
    def __init__(self, check: str, detail: str) -> None:
        super().__init__(f"conformance check {check!r} failed: {detail}")
        self.check, self.detail = check, detail


def gym_entry(rollout_id: str, call_id: str, prompt: list[int], generation: list[int]) -> dict[str, Any]:
    """A v5 ROOT entry as Gym's ``capture_tokens`` builds it."""
    return {
        "schema_version": 5, "rollout_id": rollout_id, "model_call_id": call_id, "model": "policy",
        "prompt_token_ids": prompt, "generation_token_ids": generation,
        "generation_log_probs": [-0.5 - i / 4 for i in range(len(generation))], "routed_experts": None,
        "output_items": OUTPUT, "token_item_index": 0, "created_at": 1700000000.0, "parent_call_id": None,
        "cum_len": len(prompt) + len(generation), "digest": compute_digest(prompt + generation),
        "parent_resolution": "root", "continuation_fingerprint": assistant_fingerprint(REQUEST + OUTPUT),
        "continuation_context_len": len(REQUEST), "continuation_context_digest": conversation_digest(REQUEST),
        "parent_resolution_reason": "", "fingerprint_version": 1, "prompt_is_delta": False,
        "prefix_requested": False, "prefix_supplied": False,
    }


async def run_gym_conformance(sink_factory: Callable[[], Any], source_factory: Callable[[], Any],
                              lineage_factory: Callable[[], Any] | None = None,
                              rollout_id: str = "conformance") -> list[str]:
    run = _Run(sink_factory, source_factory, lineage_factory, rollout_id)
    try:
        return await run.all()
    finally:
        for client in run.clients:
            try:
                await client.close()
            except Exception:  # closing after a failure must not hide it
                pass


class _Run:
    def __init__(self, sink_factory, source_factory, lineage_factory, rollout_id: str) -> None:
        self.sink_factory, self.source_factory, self.lineage_factory = sink_factory, source_factory, lineage_factory
        self.rollout_id = rollout_id
        self.clients: list[Any] = []
        self.passed: list[str] = []

    def sink(self) -> Any:
        return self._client(self.sink_factory)

    def source(self) -> Any:
        return self._client(self.source_factory)

    def _client(self, factory: Callable[[], Any]) -> Any:
        client = factory()
        self.clients.append(client)
        return client

    async def all(self) -> list[str]:
        checks = [self.put_then_freeze_visibility, self.idempotent_reput, self.conflicting_reput,
                  self.mark_incomplete_durability, self.freeze_idempotency, self.post_freeze_write_safety,
                  self.conditional_retirement]
        if self.lineage_factory is not None:
            checks += [self.lineage_visibility, self.fresh_client_lineage_visibility]
        if callable(getattr(self.sink(), "begin_call", None)):
            checks.append(self.begin_call_custody)
        for check in checks:
            name = check.__name__
            rid = f"{self.rollout_id}-{name.replace('_', '-')}"
            try:
                await check(name, rid)
            except GymConformanceError:
                raise
            except Exception as exc:
                raise GymConformanceError(name, f"{type(exc).__name__}: {exc}") from exc
            self.passed.append(name)
        return self.passed

    async def put_then_freeze_visibility(self, name: str, rid: str) -> None:
        entry = gym_entry(rid, "call-1", [11, 12], [13, 14])
        await self.sink().put(entry)
        snap = await self.source().freeze(rid)
        _require(name, len(snap.entries) == 1, f"{len(snap.entries)} entries, expected 1")
        _require(name, not snap.incomplete, "snapshot incomplete")
        _require(name, bool(snap.snapshot_id), "empty snapshot_id")
        _require(name, _dump(snap.entries[0]) == _dump(entry), "the entry did not round-trip byte-equal")

    async def idempotent_reput(self, name: str, rid: str) -> None:
        entry = gym_entry(rid, "call-1", [11, 12], [13, 14])
        sink = self.sink()
        await sink.put(entry)
        await sink.put(json.loads(json.dumps(entry)))
        snap = await self.source().freeze(rid)
        _require(name, len(snap.entries) == 1 and not snap.incomplete,
                 f"{len(snap.entries)} entries, incomplete={snap.incomplete}")

    async def conflicting_reput(self, name: str, rid: str) -> None:
        sink = self.sink()
        await sink.put(gym_entry(rid, "call-1", [11, 12], [13, 14]))
        try:
            await sink.put(gym_entry(rid, "call-1", [11, 12], [15]))
        except Exception:
            return  # refusing the conflict at put is conformant
        snap = await self.source().freeze(rid)
        _require(name, snap.incomplete, "a conflicting re-put was accepted and the snapshot is not incomplete")

    async def mark_incomplete_durability(self, name: str, rid: str) -> None:
        await self.sink().put(gym_entry(rid, "call-1", [11, 12], [13, 14]))
        before = await self.source().freeze(rid)
        await self.sink().mark_incomplete(rid, "call-2")
        after = await self.source().freeze(rid)
        _require(name, after.incomplete, "a fresh source does not see the mark")
        _require(name, after.version != before.version, "marking did not change the version")
        dropped = await self.source().drop(rid, snapshot_id=before.snapshot_id, version=before.version)
        _require(name, dropped is False, "the pre-mark snapshot could still be dropped")

    async def freeze_idempotency(self, name: str, rid: str) -> None:
        await self.sink().put(gym_entry(rid, "call-1", [11, 12], [13, 14]))
        a = await self.source().freeze(rid)
        b = await self.source().freeze(rid)
        _require(name, (a.snapshot_id, a.version) == (b.snapshot_id, b.version),
                 f"{a.snapshot_id}@{a.version} then {b.snapshot_id}@{b.version}")
        _require(name, _digests(a) == _digests(b), "the two freezes hold different entries")

    async def post_freeze_write_safety(self, name: str, rid: str) -> None:
        sink = self.sink()
        await sink.put(gym_entry(rid, "call-1", [11, 12], [13, 14]))
        snap = await self.source().freeze(rid)
        try:
            await sink.put(gym_entry(rid, "call-2", [11, 12, 13, 14, 21], [22]))
        except Exception:
            return
        dropped = await self.source().drop(rid, snapshot_id=snap.snapshot_id, version=snap.version)
        _require(name, dropped is False, "a write after the freeze left the stale snapshot droppable")

    async def conditional_retirement(self, name: str, rid: str) -> None:
        await self.sink().put(gym_entry(rid, "call-1", [11, 12], [13, 14]))
        source = self.source()
        snap = await source.freeze(rid)
        wrong = await source.drop(rid, snapshot_id=snap.snapshot_id, version=snap.version + 1)
        _require(name, wrong is False, "a drop naming another version succeeded")
        again = await self.source().freeze(rid)
        _require(name, len(again.entries) == 1, "evidence was lost by a refused drop")
        right = await source.drop(rid, snapshot_id=again.snapshot_id, version=again.version)
        _require(name, right is True, "the exact snapshot could not be dropped")

    async def lineage_visibility(self, name: str, rid: str, fresh: bool = False) -> None:
        resolver = None if fresh else self._client(self.lineage_factory)
        await self.sink().put(gym_entry(rid, "call-1", [101, 102, 103], [201, 202]))
        resolver = resolver or self._client(self.lineage_factory)
        follow_up = [{"role": "user", "content": "And tomorrow?"}]
        faithful = await resolver.resolve(rid, REQUEST + OUTPUT + follow_up)
        _require(name, faithful.status == "resolved" and faithful.match is not None
                 and faithful.match.model_call_id == "call-1"
                 and faithful.match.cumulative_token_ids == [101, 102, 103, 201, 202],
                 f"faithful continuation resolved as {faithful}")
        rewritten = [{"role": "user", "content": "What is the weather in Berlin?"}, *OUTPUT, *follow_up]
        _require(name, (await resolver.resolve(rid, rewritten)).status == "unresolved",
                 "a rewritten conversation resolved")
        _require(name, (await resolver.resolve(rid, REQUEST)).status == "root", "a request with no history is not a root")

    async def fresh_client_lineage_visibility(self, name: str, rid: str) -> None:
        await self.lineage_visibility(name, rid, fresh=True)

    async def begin_call_custody(self, name: str, rid: str) -> None:
        sink = self.sink()
        result = sink.begin_call(rid, "call-lost")
        if inspect.isawaitable(result):
            await result
        snap = await self.source().freeze(rid)
        _require(name, snap.incomplete, "an intent without an entry did not make the snapshot incomplete")


def _dump(entry: Any) -> str:
    data = entry if isinstance(entry, dict) else entry.model_dump()
    return json.dumps(data, sort_keys=True)


def _digests(snapshot: Any) -> dict[str, str]:
    return {_field(e, "model_call_id"): _field(e, "digest") for e in snapshot.entries}


def _field(entry: Any, name: str) -> Any:
    return entry[name] if isinstance(entry, dict) else getattr(entry, name)


def _require(check: str, condition: bool, detail: str) -> None:
    if not condition:
        raise GymConformanceError(check, detail)
