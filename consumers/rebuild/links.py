"""Linking a snapshot's calls into a forest of verified deltas (pure).

Works on the processor's verified lineage: a RESOLVED call stores its prompt as
a delta against its parent, so a call's cumulative tokens are the path of
deltas from its root and are never materialised per call (linear in tokens,
not calls x tokens). Every link is re-verified here, never trusted:

- a delta link: the parent's digest is the ``parent_digest`` the delta refers
  to and the lengths add up (O(1)); the delivered chain's full digest is checked
  once when the trajectory is built;
- a full-prompt link (snapshots not written by our fold): the digest of the
  child's prompt prefix equals the parent's digest.

Both checks are ``schemas.lineage_rules``', the ones the processor applies.

Two kinds of full-prompt call depend on the order the processor folded the
calls in: a claim it deferred (note ``parent_missing:<claimed>``: the claimed
parent was not in the state yet, being later in the log or lost) and a cold
call no candidate verified for yet (UNRESOLVED, note ``unresolved:<reason>``).
``settle_deferred`` decides them first, where every call is known, by the
processor's own rule over the same candidates, so the record is the one the
causal order gives; a deferred claim whose parent is absent is recovered onto
its nearest verified ancestor, below.

A link that fails, an UNRESOLVED call, or a processor note that says the claim
failed, starts a *boundary* fragment (``parent_link_failures``,
``unresolved_parent_calls``). Recovery happens only where the snapshot lacks the
parent (``parent_call_id_missing_recovered``, never a guess):

- the parent is an empty generation or a side call: it is spliced out, its
  delta prepended to the child's (exact, Gym's prefix-trie recovery);
- the parent is absent: a delta child is linked to the unique call whose
  cumulative digest is the child's ``parent_digest``; a full-prompt child to the
  call with the longest cumulative that is a digest-verified prefix of its
  prompt (one hash per distinct candidate length); a deferred one first to a
  verified candidate of its request fingerprint, and never when several
  different ones verify (ambiguous: ``parent_call_id_missing``). Identical
  cumulative tokens are interchangeable and collapse to the smallest call id.

UNRESOLVED and ROOT calls never use recovery: the capture decided they start a
new conversation (a cold call is only ever resolved by the processor's rule).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from operator import attrgetter

from consumers.rebuild.sidecalls import SideCall
from schemas.hashing import compute_digest
from schemas.lineage_rules import (
    AMBIGUOUS,
    PARENT_MISSING,
    delta_link_holds,
    delta_parent_len,
    full_prompt_parent,
    prefix_verified,
)
from schemas.records import CallCaptured, ParentResolution, SnapshotCall

RECOVERED = "parent_call_id_missing_recovered"
BY_SEQ = attrgetter("seq", "call.model_call_id")  # the snapshot's (seq, call id) order, with no Python call per call
_DEFERRED = PARENT_MISSING + ":"  # the processor's note on a full prompt whose claimed parent it had not folded
_RARE_NOTES = ("delta_parent_mismatch", _DEFERRED)


@dataclass(slots=True, eq=False)
class Node:
    call: CallCaptured
    seq: int
    late: bool
    note: str
    delta: list[int]  # prompt tokens new relative to the parent (the full prompt for a root)
    parent: Node | None = None
    children: list[Node] = field(default_factory=list)
    quarantined: bool = False
    boundary: str | None = None  # why this node starts a fragment (None: a clean ROOT or a linked node)
    side: SideCall | None = None

    @property
    def call_id(self) -> str:
        return self.call.model_call_id

    @property
    def generation(self) -> list[int]:
        return self.call.generation_token_ids

    @property
    def order_key(self) -> tuple[float, str]:
        return (self.call.created_at, self.call_id)


@dataclass(slots=True)
class Links:
    nodes: dict[str, Node]  # every unique call, by id, in seq order
    conflicts: list[str]
    failures: Counter[str]
    unresolved: list[str]  # calls that start a boundary fragment
    recovered: list[str]
    spliced_side_parents: list[str]


def settle_deferred(calls: list[SnapshotCall]) -> list[SnapshotCall]:
    """The calls as the processor would have stored them had every call been folded before them.

    Two kinds of full-prompt call depend on the order the processor folded them in: a claim whose
    parent was not folded yet (note ``parent_missing``), and a cold call (UNRESOLVED, with a request
    fingerprint) no candidate verified for yet (note ``unresolved:<reason>``). Each is decided here by
    the processor's rule (``full_prompt_parent``) over the same candidates, taken from every call: the
    calls with its request fingerprint, and its claim. A call linked so gets its parent id, exactly as
    the processor stores it (its prompt stays whole; the link verifies it again), so side-call rules,
    linking and every later step see what the causal order gives. A claim whose parent is not in the
    snapshot is left for recovery (``_recover_deferred``); a cold call nothing verifies for stays
    unresolved. Per call a dict lookup; hashing only for the calls it settles.
    """
    if not any(_order_dependent(sc) for sc in calls):
        return calls  # the common case: one pass over the notes
    first: dict[str, SnapshotCall] = {}
    for sc in sorted(calls, key=BY_SEQ):
        first.setdefault(sc.call.model_call_id, sc)
    pending = [sc.call for sc in first.values() if _order_dependent(sc)]
    by_fingerprint: dict[str, list[CallCaptured]] = {}
    for sc in first.values():
        if sc.call.continuation_fingerprint:
            by_fingerprint.setdefault(sc.call.continuation_fingerprint, []).append(sc.call)
    settled: dict[str, tuple[CallCaptured, CallCaptured, str]] = {}
    for call in pending:
        claimed = call.parent_call_id
        claim = first.get(claimed) if claimed is not None else None
        if claimed is not None and claim is None:
            continue  # lost: recovered onto an ancestor when linked
        candidates = {c.model_call_id: (c.cum_len, c.digest) for c in by_fingerprint.get(call.request_fingerprint, ())}
        if claim is not None:
            candidates[claim.call.model_call_id] = (claim.call.cum_len, claim.call.digest)
        candidates.pop(call.model_call_id, None)
        parent_id, verified = full_prompt_parent(call.prompt_token_ids, claimed, candidates)
        # The processor's notes (``processors.lineage``), as it would have written them.
        if parent_id is not None:
            note = "verified" if parent_id == claimed else (
                "resolved_by_processor" if claimed is None else f"resolved_by_processor:claimed={claimed}")
            new = dataclasses.replace(call, parent_call_id=parent_id, parent_resolution=ParentResolution.RESOLVED,
                                      parent_resolution_reason="", parent_digest=candidates[parent_id][1])
        elif claimed is None:
            continue  # a cold call nothing continues: unresolved, as the processor said
        else:
            reason, note = (AMBIGUOUS, f"{AMBIGUOUS}:{','.join(verified)}") if verified else (
                "parent_digest_mismatch", f"parent_digest_mismatch:claimed={claimed}")
            new = dataclasses.replace(call, parent_call_id=None, parent_resolution=ParentResolution.UNRESOLVED,
                                      parent_resolution_reason=reason, parent_digest="")
        settled[call.model_call_id] = (call, new, note)
    if not settled:
        return calls
    out = []
    for sc in calls:
        change = settled.get(sc.call.model_call_id)
        if change is not None and sc.call == change[0]:  # every copy of it (a conflicting one stays)
            sc = dataclasses.replace(sc, call=change[1], lineage_note=change[2])
        out.append(sc)
    return out


def _order_dependent(sc: SnapshotCall) -> bool:
    call = sc.call
    if call.prompt_is_delta:
        return False
    if call.parent_resolution is ParentResolution.RESOLVED:
        return sc.lineage_note.startswith(_DEFERRED)
    return (call.parent_resolution is ParentResolution.UNRESOLVED and bool(call.request_fingerprint)
            and sc.lineage_note.startswith("unresolved:"))


def link_calls(calls: list[SnapshotCall], side: dict[str, SideCall]) -> Links:
    """Deduplicate, link, verify and recover; then splice out empty generations and side calls."""
    by_id: dict[str, SnapshotCall] = {}
    conflicts: list[str] = []
    for sc in sorted(calls, key=BY_SEQ):
        first = by_id.get(sc.call.model_call_id)
        if first is None:
            by_id[sc.call.model_call_id] = sc
        elif first.call != sc.call:
            conflicts.append(sc.call.model_call_id)
    nodes = {cid: Node(sc.call, sc.seq, sc.late, sc.lineage_note, sc.call.prompt_token_ids) for cid, sc in by_id.items()}
    for cid, why in side.items():  # the few side calls marked after: no keyword argument and lookup per node
        if cid in nodes:
            nodes[cid].side = why
    links = Links(nodes, sorted(set(conflicts)), Counter(), [], [], [])
    for cid in links.conflicts:
        links.failures["duplicate_call_id_conflict"] += 1
        links.unresolved.append(cid)
    index = _Index(nodes)
    for node in nodes.values():
        _link(node, nodes, index, links)
    if _break_cycles(nodes.values(), links):
        links.failures["lineage_cycle"] += 1
    _splice(nodes, links)
    links.unresolved = sorted(set(links.unresolved))
    return links


def _boundary(node: Node, links: Links, reason: str) -> None:
    node.boundary = reason
    links.failures[reason] += 1
    links.unresolved.append(node.call_id)


def _link(node: Node, nodes: dict[str, Node], index: _Index, links: Links) -> None:
    call = node.call
    if call.parent_resolution is ParentResolution.ROOT:
        return
    if call.parent_resolution is ParentResolution.UNRESOLVED:
        # The processor turns a claim that failed verification into UNRESOLVED; say which.
        failed = node.note.startswith("parent_digest_mismatch")
        _boundary(node, links, "parent_digest_mismatch" if failed else "parent_unresolved")
        return
    note = node.note
    if note.startswith(_RARE_NOTES):  # one check for the two notes below (a linked call's is "verified")
        if note.startswith("delta_parent_mismatch"):
            _fail(node, links, "delta_chain_unreconstructable")
            return
        if note.startswith(_DEFERRED) and not call.prompt_is_delta and (call.parent_call_id or "") not in nodes:
            _recover_deferred(node, index, links)
            return
    # A "delta_parent_missing" note only says the parent was not folded yet when the
    # child was: look it up now, and verify the link here either way.
    parent = nodes.get(call.parent_call_id or "")
    if parent is None:
        parent = index.recover(node)
        if parent is None:
            _fail(node, links, "delta_chain_unreconstructable" if call.prompt_is_delta else "parent_call_id_missing")
            return
        links.failures[RECOVERED] += 1
        links.recovered.append(node.call_id)
    if call.prompt_is_delta:
        if not delta_link_holds(call, parent.call.cum_len, parent.call.digest):
            _fail(node, links, "delta_chain_unreconstructable")
            return
    else:
        cut = parent.call.cum_len
        prompt = call.prompt_token_ids
        if not prefix_verified(prompt, cut, parent.call.digest):
            _fail(node, links, "parent_digest_mismatch")
            return
        node.delta = prompt[cut:]
    node.parent = parent


def _recover_deferred(node: Node, index: _Index, links: Links) -> None:
    """A deferred full prompt whose claimed parent is not in the snapshot: NeMo Gym's recovery.

    Onto the nearest verified ancestor (``parent_call_id_missing_recovered``): the verified candidate
    of its request fingerprint (the processor's rule, the claim aside), else the call with the longest
    verified cumulative prefix. Several different verified candidates are an ambiguity, never
    recovered from (``parent_call_id_missing``).
    """
    call = node.call
    candidates = {n.call_id: (n.call.cum_len, n.call.digest) for n in index.continuing(call.request_fingerprint)}
    candidates.pop(node.call_id, None)
    parent_id, verified = full_prompt_parent(call.prompt_token_ids, None, candidates)
    parent = index.node(parent_id) if parent_id is not None else None if verified else index.recover(node)
    if parent is None:
        _boundary(node, links, "parent_call_id_missing")
        return
    links.failures[RECOVERED] += 1
    links.recovered.append(node.call_id)
    node.delta = call.prompt_token_ids[parent.call.cum_len :]
    node.parent = parent


def _fail(node: Node, links: Links, reason: str) -> None:
    _boundary(node, links, reason)
    if node.call.prompt_is_delta:
        # A delta against an unknown or unverified parent has no usable prompt.
        node.delta = []
        node.quarantined = True


class _Index:
    """Recovery lookups over the snapshot's cumulative digests (built on first use)."""

    def __init__(self, nodes: dict[str, Node]) -> None:
        self._nodes = nodes
        self._by_digest: dict[str, list[Node]] | None = None
        self._by_fingerprint: dict[str, list[Node]] | None = None

    def node(self, call_id: str) -> Node:
        return self._nodes[call_id]

    def continuing(self, fingerprint: str) -> list[Node]:
        """The calls whose continuation fingerprint is ``fingerprint`` (the processor's index, whole)."""
        if not fingerprint:
            return []
        if self._by_fingerprint is None:
            self._by_fingerprint = {}
            for node in self._nodes.values():
                if node.call.continuation_fingerprint:
                    self._by_fingerprint.setdefault(node.call.continuation_fingerprint, []).append(node)
        return self._by_fingerprint.get(fingerprint, [])

    def _digests(self) -> dict[str, list[Node]]:
        if self._by_digest is None:
            self._by_digest = {}
            for node in self._nodes.values():
                self._by_digest.setdefault(node.call.digest, []).append(node)
        return self._by_digest

    def recover(self, node: Node) -> Node | None:
        call = node.call
        by_digest = self._digests()
        if call.prompt_is_delta:
            parent_len = delta_parent_len(call)
            found = [n for n in by_digest.get(call.parent_digest, ()) if n is not node and n.call.cum_len == parent_len]
            return min(found, key=lambda n: n.call_id) if found else None
        prompt = call.prompt_token_ids
        by_length: dict[int, list[Node]] = {}
        for other in self._nodes.values():
            if other is not node and other.call.cum_len <= len(prompt):
                by_length.setdefault(other.call.cum_len, []).append(other)
        for length in sorted(by_length, reverse=True):
            # Cheap filter first: a prefix parent's generation ends the prefix.
            plausible = [n for n in by_length[length] if _ends_with(prompt, length, n.generation)]
            if not plausible:
                continue
            digest = compute_digest(prompt[:length])
            found = [n for n in plausible if n.call.digest == digest]
            if found:
                return min(found, key=lambda n: n.call_id)
        return None


def _ends_with(prompt: list[int], length: int, tail: list[int]) -> bool:
    return not tail or (len(tail) <= length and prompt[length - len(tail) : length] == tail)


def _break_cycles(nodes: Iterable[Node], links: Links) -> bool:
    """Cut every cycle (possible only in forged snapshots); its members become boundaries."""
    state: dict[Node, int] = {}  # node (hashed by identity) -> 1 on the current walk, 2 finished
    found = False
    for start in nodes:
        parent = start.parent
        if parent is None or state.get(parent) == 2:
            state[start] = 2  # the common case: its parent's ancestry is known to end, so does its own
            continue
        path: list[Node] = []
        node: Node | None = start
        while node is not None and (seen := state.get(node)) != 2:
            if seen == 1:
                cycle = path[path.index(node):]
                for member in cycle:
                    member.parent = None
                    member.boundary = "lineage_cycle"
                    links.unresolved.append(member.call_id)
                    if member.call.prompt_is_delta:
                        member.delta, member.quarantined = [], True
                found = True
                break
            state[node] = 1
            path.append(node)
            node = node.parent
        for n in path:
            state[n] = 2
    return found


def _splice(nodes: dict[str, Node], links: Links) -> None:
    """Relink children of empty-generation and side calls to their nearest kept ancestor.

    The spliced call's delta and generation become the child's prompt (mask 0):
    an empty call generated nothing, and a side call's output is not the
    policy's. A child spliced onto no ancestor inherits the boundary of the
    fragment it came from.
    """
    for node in nodes.values():
        parent = node.parent
        if parent is None or (parent.call.generation_token_ids and parent.side is None):  # _kept, inlined
            continue
        prefix: list[int] = []
        through_side = False
        boundary = None
        while parent is not None and not _kept(parent):
            prefix = parent.delta + parent.generation + prefix
            through_side = through_side or parent.side is not None
            boundary = parent.boundary
            parent = parent.parent
        node.delta = prefix + node.delta
        node.parent = parent
        if parent is None and boundary is not None:
            node.boundary = boundary
        if not _kept(node):
            continue
        if through_side:
            links.spliced_side_parents.append(node.call_id)
        else:
            links.failures[RECOVERED] += 1
            links.recovered.append(node.call_id)


def _kept(node: Node) -> bool:
    return bool(node.generation) and node.side is None
