"""The call graph of a snapshot: links, boundaries, empty generations, retries, chains (pure).

Works on the processor's verified lineage: a RESOLVED call stores its prompt as
a delta against its parent, so a call's cumulative tokens are the path of
deltas from its root and are never materialised per call (the whole build is
linear in tokens, not calls × tokens).

Rules (NeMo Gym's builder, adapted to verified deltas):
- dedupe by call id; a conflicting duplicate counts as ``duplicate_call_id_conflict``;
- empty generations are excluded and never parents: a child of an empty call is
  relinked to the empty call's parent by concatenating the deltas (exact, so
  this is the recovery Gym does with a prefix trie: ``parent_call_id_missing_recovered``);
- UNRESOLVED calls, and calls whose link failed verification, start a boundary
  fragment (counted in ``parent_link_failures`` and ``unresolved_parent_calls``);
- retry siblings (same parent, same new prompt tokens): the extended ones
  survive; if none is extended the smallest id survives and the group is an
  unresolved retry; the others are quarantined with their subtrees;
- chains are root-to-leaf paths over non-quarantined nodes, walked iteratively.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from schemas.records import CallCaptured, ParentResolution, SnapshotCall

RECOVERED = "parent_call_id_missing_recovered"


@dataclass(slots=True, eq=False)
class Node:
    call: CallCaptured
    seq: int
    late: bool
    note: str
    delta: list[int]  # prompt tokens new relative to the parent (the full prompt for a fragment start)
    parent: Node | None = None
    children: list[Node] = field(default_factory=list)
    quarantined: bool = False

    @property
    def call_id(self) -> str:
        return self.call.model_call_id

    @property
    def generation(self) -> list[int]:
        return self.call.generation_token_ids


@dataclass(slots=True)
class Graph:
    nodes: list[Node]
    roots: list[Node]
    chains: list[list[Node]]
    n_calls: int
    empty_generation_calls: list[str]
    link_failures: Counter[str]
    unresolved_parent_calls: list[str]
    quarantined: list[str]
    unresolved_retries: list[str]
    duplicate_conflicts: list[str]


_BOUNDARY_NOTES = ("delta_parent_missing", "delta_parent_mismatch", "parent_digest_mismatch", "ambiguous")


def build_graph(calls: list[SnapshotCall]) -> Graph:
    """Link the snapshot's calls into a forest and enumerate its chains."""
    by_id: dict[str, SnapshotCall] = {}
    conflicts: list[str] = []
    for sc in sorted(calls, key=lambda c: c.seq):
        first = by_id.get(sc.call.model_call_id)
        if first is None:
            by_id[sc.call.model_call_id] = sc
        elif first.call != sc.call:
            conflicts.append(sc.call.model_call_id)
    failures: Counter[str] = Counter()
    unresolved: list[str] = []
    nodes = {cid: Node(sc.call, sc.seq, sc.late, sc.lineage_note, sc.call.prompt_token_ids) for cid, sc in by_id.items()}
    for cid in conflicts:
        failures["duplicate_call_id_conflict"] += 1
        unresolved.append(cid)
    empty = [n.call_id for n in nodes.values() if not n.generation]

    for node in nodes.values():
        call = node.call
        if call.parent_resolution is ParentResolution.UNRESOLVED:
            failures["parent_unresolved"] += 1
            unresolved.append(node.call_id)
            continue
        if call.parent_resolution is ParentResolution.ROOT:
            continue
        failed = next((b for b in _BOUNDARY_NOTES if node.note.startswith(b)), None)
        parent = nodes.get(call.parent_call_id or "")
        if failed or parent is None:
            reason = "delta_chain_unreconstructable" if call.prompt_is_delta else (failed or "parent_call_id_missing")
            failures[reason] += 1
            unresolved.append(node.call_id)
            node.delta = []  # an unreconstructable delta has no usable prompt
            node.quarantined = call.prompt_is_delta
            continue
        node.parent = parent

    if _has_cycle(nodes.values()):
        for node in nodes.values():
            node.parent = None
        failures["lineage_cycle"] += 1
        unresolved.extend(nodes)

    _splice_out_empty(nodes, failures)
    live = [n for n in nodes.values() if n.generation]
    for node in live:
        if node.parent is not None:
            node.parent.children.append(node)
    roots = [n for n in live if n.parent is None]
    retries = _quarantine_retries(live, roots)
    chains = _chains(roots)
    return Graph(
        nodes=live,
        roots=roots,
        chains=chains,
        n_calls=len(by_id),
        empty_generation_calls=empty,
        link_failures=failures,
        unresolved_parent_calls=sorted(set(unresolved)),
        quarantined=sorted(n.call_id for n in live if n.quarantined),
        unresolved_retries=retries,
        duplicate_conflicts=conflicts,
    )


def _has_cycle(nodes) -> bool:
    state: dict[int, int] = {}  # id(node) -> 1 visiting, 2 done
    for start in nodes:
        path = []
        node = start
        while node is not None and state.get(id(node)) != 2:
            if state.get(id(node)) == 1:
                return True
            state[id(node)] = 1
            path.append(node)
            node = node.parent
        for n in path:
            state[id(n)] = 2
    return False


def _splice_out_empty(nodes: dict[str, Node], failures: Counter[str]) -> None:
    """Relink children of empty-generation calls to the nearest non-empty ancestor."""
    for node in nodes.values():
        parent = node.parent
        if parent is None or parent.generation:
            continue
        prefix: list[int] = []
        while parent is not None and not parent.generation:
            prefix = parent.delta + prefix
            parent = parent.parent
        node.delta = prefix + node.delta
        node.parent = parent
        failures[RECOVERED] += 1


def _quarantine_retries(live: list[Node], roots: list[Node]) -> list[str]:
    """Quarantine abandoned retry siblings, deepest groups first; return unresolved retries."""
    depth: dict[int, int] = {}
    for node in live:  # iterative depth: walk up until a known depth
        path, cur = [], node
        while cur is not None and id(cur) not in depth:
            path.append(cur)
            cur = cur.parent
        base = depth[id(cur)] if cur is not None else -1
        for n in reversed(path):
            base += 1
            depth[id(n)] = base
    groups: dict[tuple, list[Node]] = {}
    for node in live:
        groups.setdefault((id(node.parent), tuple(node.delta)), []).append(node)
    unresolved: list[str] = []
    for key in sorted((k for k, g in groups.items() if len(g) > 1), key=lambda k: -depth[id(groups[k][0])]):
        siblings = groups[key]
        extended = [n for n in siblings if any(not c.quarantined for c in n.children)]
        keep = extended or [min(siblings, key=lambda n: n.call_id)]
        if not extended:
            unresolved.extend(sorted(n.call_id for n in siblings))
        for node in siblings:
            if node not in keep:
                _quarantine_subtree(node)
    return unresolved


def _quarantine_subtree(node: Node) -> None:
    stack = [node]
    while stack:
        n = stack.pop()
        n.quarantined = True
        stack.extend(n.children)


def _chains(roots: list[Node]) -> list[list[Node]]:
    """Root-to-leaf paths over non-quarantined nodes (iterative: a 1,100-call chain is fine)."""
    chains: list[list[Node]] = []
    for root in roots:
        if root.quarantined:
            continue
        stack: list[tuple[Node, int]] = [(root, 0)]
        path: list[Node] = []
        while stack:
            node, depth = stack.pop()
            del path[depth:]
            path.append(node)
            kids = [c for c in node.children if not c.quarantined]
            if not kids:
                chains.append(list(path))
            for child in sorted(kids, key=lambda c: (c.call.created_at, c.call_id), reverse=True):
                stack.append((child, depth + 1))
    return chains
