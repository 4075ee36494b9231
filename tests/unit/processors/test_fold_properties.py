"""Properties of the fold over random rollouts (hypothesis): duplicates, crashes and replays change nothing.

The logs come from ``scenarios``: trees of calls published as verified deltas,
cold full prompts, right and wrong claims, rewritten histories, identical
retries, forks and ambiguous continuations, with conflicting payloads,
incomplete markers, finishes, late writes, retirements and late writers.
The reference is one clean pass over the log with Kafka positions.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processors.fold import DeadLetter
from processors.replay import MemoryState, replay
from processors.state import header_codec
from schemas.codec import decode_snapshot, encode_snapshot
from schemas.hashing import compute_digest
from schemas.records import ParentResolution
from tests.unit.processors.scenarios import RolloutPlan, encoded, interleave, rollout_events, with_duplicates

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass
class Run:
    state: MemoryState = field(default_factory=MemoryState)
    emitted: list[tuple[str, bytes]] = field(default_factory=list)
    per_event_writes: list[list[tuple[bytes, bytes | None]]] = field(default_factory=list)
    per_event_emitted: list[list[tuple[str, bytes]]] = field(default_factory=list)
    deadletters: list[DeadLetter] = field(default_factory=list)


def run(records, *, state=None, positions=True, start=0) -> Run:
    out = Run(state=MemoryState() if state is None else MemoryState(state))
    for step in replay(records[start:], state=out.state, offsets_from=start if positions else None):
        res = step.result
        emitted = [(s.rollout_id, s.data) for s in res.emitted]
        out.emitted += emitted
        out.per_event_emitted.append(emitted)
        out.per_event_writes.append(list(res.writes.items()))
        out.deadletters += res.deadletters
    return out


def distinct(emitted) -> list[bytes]:
    seen: dict[bytes, None] = {}
    for _, data in emitted:
        seen.setdefault(data, None)
    return list(seen)


def last_per_rollout(emitted) -> dict[str, bytes]:
    return {rid: data for rid, data in emitted}


def without_positions(state: dict) -> dict:
    """The state with the headers' applied positions blanked (they name offsets, which duplicates shift)."""
    out = {}
    for key, value in state.items():
        if key.startswith(b"h\x00"):
            header = header_codec().decode(value)
            value = header_codec().encode(dataclasses.replace(header, applied_partition=-1, applied_offset=-1))
        out[key] = value
    return out


@st.composite
def logs(draw, max_rollouts: int = 4):
    rng = draw(st.randoms(use_true_random=False))
    n = draw(st.integers(1, max_rollouts))
    per_rollout = [rollout_events(rng, f"r{i}", RolloutPlan(n_calls=rng.randint(1, 8))) for i in range(n)]
    return rng, interleave(rng, per_rollout)


@SETTINGS
@given(logs(), st.integers(1, 12))
def test_duplicates_change_neither_the_snapshots_nor_the_state(drawn, n_dups):
    rng, log = drawn
    ref = run(encoded(log))
    dup = run(encoded(with_duplicates(rng, log, n_dups)))
    assert distinct(dup.emitted) == distinct(ref.emitted)
    assert last_per_rollout(dup.emitted) == last_per_rollout(ref.emitted)
    assert without_positions(dup.state) == without_positions(ref.state)
    assert [d.reason for d in dup.deadletters] == [d.reason for d in ref.deadletters]


@SETTINGS
@given(logs(), st.integers(0, 6), st.randoms(use_true_random=False))
def test_a_crash_anywhere_then_redelivery_gives_the_clean_result(drawn, n_dups, crash):
    """A crash leaves the changelog at any prefix of the writes, even inside one event's writes;
    the worker had emitted the outputs of any events up to some later point; offsets were
    committed at or before the changelog. Redelivery from the committed offset converges."""
    rng, log = drawn
    records = encoded(with_duplicates(rng, log, n_dups))
    ref = run(records)
    k = crash.randint(0, len(records))  # the first event not fully in the changelog
    recovered: dict = {}
    for writes in ref.per_event_writes[:k]:
        apply_writes_list(recovered, writes)
    if k < len(records):
        apply_writes_list(recovered, ref.per_event_writes[k][: crash.randint(0, len(ref.per_event_writes[k]))])
    committed = crash.randint(0, k)
    processed = crash.randint(k, len(records))
    before = [e for emitted in ref.per_event_emitted[:processed] for e in emitted]
    after = run(records, state=recovered, start=committed)
    assert after.state == ref.state
    assert set(distinct(before + after.emitted)) == set(distinct(ref.emitted))
    assert last_per_rollout(before + after.emitted) == last_per_rollout(ref.emitted)
    assert {d.reason for d in after.deadletters} <= {d.reason for d in ref.deadletters}, after.deadletters


@SETTINGS
@given(logs(), st.integers(0, 8))
def test_replay_without_positions_gives_the_same_snapshots(drawn, n_dups):
    rng, log = drawn
    ref = run(encoded(log))
    replay = run(encoded(with_duplicates(rng, log, n_dups)), positions=False)
    assert distinct(replay.emitted) == distinct(ref.emitted)
    assert without_positions(replay.state) == without_positions(ref.state)


@SETTINGS
@given(logs(max_rollouts=2))
def test_every_link_the_fold_asserts_is_token_exact_and_snapshots_are_canonical_avro(drawn):
    _, log = drawn
    for data in distinct(run(encoded(log)).emitted):
        assert encode_snapshot(decode_snapshot(data)) == data
        snap = decode_snapshot(data)
        calls = {sc.call.model_call_id: sc for sc in snap.calls}
        for sc in snap.calls:
            call = sc.call
            if call.parent_resolution is ParentResolution.UNRESOLVED:
                assert call.parent_resolution_reason, "an unresolved call always says why"
                assert not call.prompt_is_delta
            if sc.lineage_note.startswith(("verified", "resolved_by_processor")) and call.parent_call_id:
                full = _cumulative(calls, call.parent_call_id) + list(call.prompt_token_ids)
                assert compute_digest(full + list(call.generation_token_ids)) == call.digest


def _cumulative(calls, call_id: str) -> list[int]:
    """The full prompt + generation of a call, materialised from verified deltas."""
    path = []
    while call_id is not None:
        sc = calls[call_id]
        path.append(sc.call)
        call_id = sc.call.parent_call_id if sc.call.prompt_is_delta else None
    ids: list[int] = []
    for call in reversed(path):
        ids += list(call.prompt_token_ids) + list(call.generation_token_ids)
    return ids


def apply_writes_list(state: dict, writes) -> None:
    for key, value in writes:
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value


def test_the_scenarios_cover_every_lineage_outcome():
    """The generator is only worth its properties if it reaches every branch of the lineage authority."""
    notes, reasons = set(), set()
    rng = random.Random(7)
    for i in range(60):
        log = rollout_events(rng, f"cov{i}", RolloutPlan(n_calls=8, p_oddity=0.5))
        for data in distinct(run(encoded(log)).emitted):
            for sc in decode_snapshot(data).calls:
                notes.add(sc.lineage_note.split(":")[0])
            reasons |= {m.reason for m in decode_snapshot(data).incomplete_markers}
    assert {"root", "verified", "resolved_by_processor", "ambiguous", "parent_digest_mismatch",
            "unresolved"} <= notes
    assert {"conflicting_payload", "intent_without_capture", "upstream_error"} <= reasons
