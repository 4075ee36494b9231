"""Random agent rollouts as rollout-events logs, for the fold's property and integration tests.

A rollout is a tree of model calls (a call's full prompt = its parent's
cumulative ids + new tokens). Each call is published the way some interceptor
would have: a verified delta, a cold full prompt the processor must resolve, a
full prompt with a claim (right or wrong), a rewritten history, an identical
retry, a forked sibling, an ambiguous continuation. Around the calls: duplicate
publications, a conflicting payload, incomplete markers, the finish, late
writes, a second finish, retirements (exact and stale) and a late writer after
retirement. Everything is drawn from one ``random.Random``, so a seed (or
hypothesis' ``st.randoms()``) reproduces a log exactly.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from dataclasses import dataclass, field

from processors.replay import replay
from schemas.codec import encode_event
from schemas.records import CallCaptured, ParentResolution, RolloutEvent
from tests.factories import event, finished, hashed, incomplete, make_call, retire, started

VOCAB = 50_000


@dataclass
class _Node:
    call: CallCaptured
    cum: list[int]
    fingerprint: str
    children: int = 0


@dataclass
class RolloutPlan:
    """Knobs of one rollout; ``sizes`` = (new prompt tokens, generated tokens) ranges."""

    n_calls: int = 6
    root_tokens: tuple[int, int] = (3, 12)
    new_tokens: tuple[int, int] = (1, 6)
    gen_tokens: tuple[int, int] = (0, 5)
    p_fork: float = 0.15
    p_cold: float = 0.3
    p_oddity: float = 0.25  # any of: identical retry, rewritten history, wrong claim, ambiguous, conflict
    p_incomplete: float = 0.1
    p_intent: float = 0.2
    p_late: float = 0.3
    p_retire: float = 0.4
    calls_so_far: list[str] = field(default_factory=list)


def rollout_events(rng: random.Random, rid: str, plan: RolloutPlan | None = None) -> list[RolloutEvent]:
    """One rollout's events in publication order (parents before children, per interceptor)."""
    plan = plan or RolloutPlan()
    nodes: list[_Node] = []
    events: list[RolloutEvent] = []
    ids = _Ids(rid, rng)

    def tokens(lo_hi: tuple[int, int]) -> list[int]:
        return [rng.randrange(VOCAB) for _ in range(rng.randint(*lo_hi))]

    def publish(call: CallCaptured, **kw) -> None:
        if rng.random() < plan.p_intent:  # a Gym-style begin_call before the call
            events.append(event(rid, started(call.model_call_id), event_id=ids.event()))
        events.append(event(rid, call, event_id=ids.event(), **kw))

    def add(parent: _Node | None, new: list[int], gen: list[int], fingerprint: str | None = None) -> _Node:
        call_id = ids.call()
        fp = fingerprint or hashed(f"cfp-{call_id}")
        if parent is None:
            call = make_call(new, gen, call_id=call_id, continuation_fingerprint=fp, created_at=float(len(nodes)))
            node = _Node(call, new + gen, fp)
        else:
            prompt = parent.cum + new
            mode = "cold" if rng.random() < plan.p_cold else "delta"
            common = dict(call_id=call_id, continuation_fingerprint=fp, request_fingerprint=parent.fingerprint,
                          created_at=float(len(nodes)))
            if mode == "delta":
                call = make_call(prompt, gen, parent=parent.call.model_call_id, delta_of=parent.cum,
                                 parent_digest=parent.call.digest, **common)
            else:
                call = make_call(prompt, gen, resolution=ParentResolution.UNRESOLVED, **common)
            node = _Node(call, prompt + gen, fp)
            parent.children += 1
        nodes.append(node)
        publish(node.call)
        return node

    add(None, tokens(plan.root_tokens), tokens(plan.gen_tokens))
    while len(nodes) < plan.n_calls:
        leaves = [n for n in nodes if n.children == 0] or nodes
        parent = rng.choice(nodes) if rng.random() < plan.p_fork else rng.choice(leaves)
        if rng.random() < plan.p_oddity:
            _oddity(rng, ids, parent, nodes, add, publish, tokens, plan)
        else:
            add(parent, tokens(plan.new_tokens), tokens(plan.gen_tokens))
        if rng.random() < plan.p_incomplete:
            lost = incomplete(ids.call() if rng.random() < 0.7 else None) if rng.random() < 0.7 else started(ids.call())
            events.append(event(rid, lost, event_id=ids.event()))  # a marker, or an intent never captured
    events.append(event(rid, finished({"reward": rng.random()}), event_id=ids.event()))
    if rng.random() < plan.p_late:
        add(rng.choice(nodes), tokens(plan.new_tokens), tokens(plan.gen_tokens))
        events.append(event(rid, finished({"reward": 0.5}), event_id=ids.event()))
    if rng.random() < plan.p_retire:
        snap = _last_snapshot(events)
        if rng.random() < 0.3:
            events.append(event(rid, retire(snap.snapshot_id, snap.version - 1), event_id=ids.event()))
        events.append(event(rid, retire(snap.snapshot_id, snap.version), event_id=ids.event()))
        if rng.random() < 0.5:  # a late writer of the retired attempt
            add(rng.choice(nodes), tokens(plan.new_tokens), tokens(plan.gen_tokens))
    return events


def _oddity(rng, ids, parent, nodes, add, publish, tokens, plan) -> None:
    kind = rng.choice(["identical_retry", "rewritten", "wrong_claim", "ambiguous", "conflict", "claimed_full"])
    if kind == "identical_retry" and parent.children:
        # Same request, same tokens, same output: a retry whose children may continue either copy.
        sibling = next(n for n in nodes if n.call.parent_call_id == parent.call.model_call_id
                       or n.call.request_fingerprint == parent.fingerprint and n is not parent)
        twin = dataclasses.replace(sibling.call, model_call_id=ids.call())
        nodes.append(_Node(twin, sibling.cum, sibling.fingerprint))
        publish(twin)
    elif kind == "rewritten" and len(parent.cum) > 1:
        # The history was rewritten (a summary) or re-rendered (template drift): the tokens no longer
        # extend the parent's, whether or not the interceptor's request-level lineage claimed it.
        drifted = list(parent.cum)
        drifted[rng.randrange(len(drifted))] = VOCAB + 1
        claim = dict(parent=parent.call.model_call_id) if rng.random() < 0.5 else dict(
            resolution=ParentResolution.UNRESOLVED)
        call_id = ids.call()
        call = make_call(drifted + tokens(plan.new_tokens), tokens(plan.gen_tokens), call_id=call_id,
                         request_fingerprint=parent.fingerprint, continuation_fingerprint=hashed(f"cfp-{call_id}"), **claim)
        publish(call)
    elif kind == "wrong_claim" and len(nodes) > 1:
        # A full prompt claiming another call as parent; the fingerprint leads to the real one.
        other = rng.choice([n for n in nodes if n is not parent])
        full = parent.cum + tokens(plan.new_tokens)
        call_id = ids.call()
        call = make_call(full, tokens(plan.gen_tokens), call_id=call_id, parent=other.call.model_call_id,
                         request_fingerprint=parent.fingerprint, continuation_fingerprint=hashed(f"cfp-{call_id}"))
        publish(call)
    elif kind == "ambiguous":
        # A child whose continuation fingerprint equals its parent's: a later request with that
        # fingerprint verifies against both, with different tokens -> ambiguous, never guessed.
        child = add(parent, tokens(plan.new_tokens), tokens((1, 3)), fingerprint=parent.fingerprint)
        add(child, tokens(plan.new_tokens), tokens(plan.gen_tokens))
    elif kind == "conflict":
        victim = rng.choice(nodes).call
        bad = dataclasses.replace(victim, generation_log_probs=[-7.0] * len(victim.generation_log_probs),
                                  output_items_json='[{"type": "message", "content": "other"}]')
        publish(bad)
    else:  # claimed_full: the interceptor resolved the parent but sent the full prompt
        full = parent.cum + tokens(plan.new_tokens)
        call_id = ids.call()
        call = make_call(full, tokens(plan.gen_tokens), call_id=call_id, parent=parent.call.model_call_id,
                         request_fingerprint=parent.fingerprint, continuation_fingerprint=hashed(f"cfp-{call_id}"))
        nodes.append(_Node(call, full + list(call.generation_token_ids), call.continuation_fingerprint))
        parent.children += 1
        publish(call)


def realistic_rollout(n_calls: int, context: int, *, cold: bool = False, generated: float = 0.4) -> list[CallCaptured]:
    """One agent loop whose context grows to ``context`` tokens over ``n_calls`` calls, ``generated`` of
    them sampled; published as verified deltas, or ``cold`` (full prompts for the processor to resolve)."""
    per_call = context // n_calls
    gen_len = int(per_call * generated)
    cum: list[int] = []
    parent = None
    out = []
    for i in range(n_calls):
        prompt = cum + [(7 * i + j) % 150_000 for j in range(per_call - gen_len)]
        gen = [(11 * i + j) % 150_000 for j in range(gen_len)]
        kw = dict(continuation_fingerprint=hashed(f"fp{i}"), request_fingerprint=hashed(f"fp{i - 1}") if parent else "",
                  log_probs=[-0.001 * j for j in range(gen_len)])
        if parent is not None and cold:
            kw["resolution"] = ParentResolution.UNRESOLVED
        elif parent is not None:
            kw.update(parent=parent.model_call_id, delta_of=cum, parent_digest=parent.digest)
        parent = make_call(prompt, gen, **kw)
        out.append(parent)
        cum = prompt + gen
    return out


def interleave(rng: random.Random, per_rollout: list[list[RolloutEvent]]) -> list[RolloutEvent]:
    """One partition's log: the rollouts' events interleaved, each rollout's order kept."""
    queues = [list(evs) for evs in per_rollout if evs]
    out: list[RolloutEvent] = []
    while queues:
        q = rng.choice(queues)
        out.append(q.pop(0))
        if not q:
            queues.remove(q)
    return out


def with_duplicates(rng: random.Random, log: list[RolloutEvent], n: int) -> list[RolloutEvent]:
    """``log`` with ``n`` duplicate publications inserted after their originals.

    A duplicate is the same event again (a producer retry, a spool drain), or,
    for calls and incomplete markers, the same payload under a new event id.
    None lands after its rollout's retirement: a retired rollout keeps no memory
    of its events, so a copy arriving then is reported as a late writer.
    """
    out = list(log)
    for k in range(n):
        i = rng.randrange(len(out))
        original = out[i]
        if any(type(e.body).__name__ == "RetireRequested" and e.rollout_id == original.rollout_id for e in out[:i]):
            continue
        retired_at = next((j for j in range(i + 1, len(out)) if out[j].rollout_id == original.rollout_id
                           and type(out[j].body).__name__ == "RetireRequested"), len(out))
        if retired_at <= i + 1 or type(original.body).__name__ == "RetireRequested":
            continue
        copy = original
        if type(original.body).__name__ in ("CallCaptured", "CallIncomplete", "CallStarted") and rng.random() < 0.5:
            copy = dataclasses.replace(original, event_id=f"{original.event_id}-again{k}",
                                       emitted_at=original.emitted_at + 1)
        out.insert(rng.randint(i + 1, retired_at), copy)
    return out


def _last_snapshot(events: list[RolloutEvent]):
    return [s for step in replay(events) for s in step.result.emitted][-1]


def encoded(log: list[RolloutEvent]) -> list[tuple[bytes, bytes]]:
    return [(ev.rollout_id.encode(), encode_event(ev)) for ev in log]


class _Ids:
    """Ids unique within a log (as uuid4s are), reproducible from the rollout id and the draws."""

    def __init__(self, rid: str, rng: random.Random) -> None:
        self.rid, self.rng, self.n = rid, rng, 0

    def call(self) -> str:
        self.n += 1
        return hashlib.sha256(f"{self.rid}/call/{self.n}/{self.rng.getrandbits(32)}".encode()).hexdigest()[:32]

    def event(self) -> str:
        self.n += 1
        return f"{self.rid}/ev/{self.n}"
