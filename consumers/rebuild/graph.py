"""The policy forest of a snapshot: retries and chains over linked nodes (pure).

``build_forest`` links the calls (``consumers.rebuild.links``) and keeps the
policy's nodes: calls with generated tokens that are not side calls. On that
forest:

- retry siblings (same parent, same new prompt tokens; all roots with the same
  prompt form one group) are resolved deepest group first: siblings that are
  *pinned* (on the attributed terminal's ancestry) or *extended* (have a
  non-quarantined child) survive; if none does, the smallest call id survives
  and the whole group is an unresolved retry; the rest are quarantined with
  their subtrees. Quarantine never deletes evidence (the ids are reported);
- chains are root-to-leaf paths over non-quarantined nodes, walked iteratively
  (a 1,100-call chain does not recurse), children in ``(created_at, call id)``
  order, so the enumeration is independent of capture order.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

from consumers.rebuild.links import Links, Node, link_calls
from consumers.rebuild.sidecalls import SideCall
from schemas.records import SnapshotCall


@dataclass(slots=True)
class Forest:
    links: Links
    live: list[Node]  # policy nodes (generated tokens, not side calls), (created_at, call id) order
    roots: list[Node]
    empty: list[str]  # call ids with no generated tokens
    side: list[Node]  # side calls

    @property
    def n_calls(self) -> int:
        return len(self.links.nodes)


_BY_ORDER = attrgetter("call.created_at", "call.model_call_id")  # Node.order_key, with no Python call per node


def build_forest(calls: list[SnapshotCall], side: dict[str, SideCall]) -> Forest:
    """Link the calls and keep the policy forest (children lists, roots)."""
    links = link_calls(calls, side)
    live, empty, side_nodes = [], [], []
    # (created_at, call id) order everywhere: the result must not depend on capture order.
    for node in sorted(links.nodes.values(), key=_BY_ORDER):
        if not node.call.generation_token_ids:
            empty.append(node.call_id)
        elif node.side is not None:
            side_nodes.append(node)
        else:
            live.append(node)
    for node in live:
        if node.parent is not None:
            node.parent.children.append(node)
    for node in live:
        if len(node.children) > 1:  # a chain's nodes have one child each: nothing to order
            node.children.sort(key=_BY_ORDER)
    for node in live:
        if node.quarantined and node.parent is None:
            _quarantine_subtree(node)  # an unreconstructable prompt: its descendants cannot be rebuilt either
    roots = [n for n in live if n.parent is None]
    return Forest(links=links, live=live, roots=roots, empty=empty, side=side_nodes)


def resolve_retries(forest: Forest, pinned: set[int]) -> list[list[str]]:
    """Quarantine abandoned retry siblings; return the unresolved retry groups (sorted call ids).

    ``pinned`` holds ``id(node)`` of nodes that must survive (the declared or
    content-attributed terminal and its ancestors).
    """
    retried = retry_groups(forest.live)
    if not retried:
        return []
    depth = _depths(forest.live)
    retried.sort(key=lambda g: (-depth[id(g[0])], min(n.call_id for n in g)))
    unresolved: list[list[str]] = []
    for siblings in retried:
        keep = [n for n in siblings if id(n) in pinned or any(not c.quarantined for c in n.children)]
        if not keep:
            keep = [min(siblings, key=lambda n: n.call_id)]
            unresolved.append(sorted(n.call_id for n in siblings))
        for node in siblings:
            if node not in keep:
                _quarantine_subtree(node)
    return unresolved


def retry_groups(live: list[Node]) -> list[list[Node]]:
    """Siblings with the same new prompt tokens (roots are one sibling set), each in ``live`` order.

    Tokens are compared only between siblings whose deltas have the same length: a chain
    (one child per node) compares none, so the grouping is linear in calls, not tokens.
    """
    if len({id(node.parent) for node in live}) == len(live):
        return []  # no two nodes share a parent (a chain, one root): no sibling set, nothing to list per node
    siblings: dict[int, list[Node]] = {}
    for node in live:
        siblings.setdefault(id(node.parent), []).append(node)
    groups: list[list[Node]] = []
    for kids in siblings.values():
        if len(kids) < 2:
            continue
        by_len: dict[int, list[Node]] = {}
        for node in kids:
            by_len.setdefault(len(node.delta), []).append(node)
        for same_len in by_len.values():
            if len(same_len) < 2:
                continue
            by_delta: dict[tuple[int, ...], list[Node]] = {}
            for node in same_len:
                by_delta.setdefault(tuple(node.delta), []).append(node)
            groups.extend(g for g in by_delta.values() if len(g) > 1)
    return groups


def _depths(live: list[Node]) -> dict[int, int]:
    depth: dict[int, int] = {}
    for node in live:  # iterative: walk up to a known depth, then assign down
        path: list[Node] = []
        cur: Node | None = node
        while cur is not None and id(cur) not in depth:
            path.append(cur)
            cur = cur.parent
        base = depth[id(cur)] if cur is not None else -1
        for n in reversed(path):
            base += 1
            depth[id(n)] = base
    return depth


def _quarantine_subtree(node: Node) -> None:
    stack = [node]
    while stack:
        n = stack.pop()
        n.quarantined = True
        stack.extend(n.children)


def chains(forest: Forest, roots: list[Node] | None = None) -> list[list[Node]]:
    """Root-to-leaf paths over non-quarantined nodes (from ``roots``, default every root), deterministic order."""
    out: list[list[Node]] = []
    for root in forest.roots if roots is None else roots:
        if root.quarantined:
            continue
        stack: list[tuple[Node, int]] = [(root, 0)]
        path: list[Node] = []
        while stack:
            node, at = stack.pop()
            del path[at:]
            path.append(node)
            kids = live_children(node)
            while len(kids) == 1:  # down a run of single children without the stack
                node = kids[0]
                path.append(node)
                kids = live_children(node)
            if not kids:
                out.append(list(path))
            at = len(path)
            for child in reversed(kids):
                stack.append((child, at))
    return out


def ancestry(node: Node) -> list[Node]:
    """Root-to-``node`` path (iterative)."""
    path = []
    cur: Node | None = node
    while cur is not None:
        path.append(cur)
        cur = cur.parent
    path.reverse()
    return path


def live_children(node: Node) -> list[Node]:
    """The node's non-quarantined children; read-only (a chain's node returns its own children list)."""
    children = node.children
    if len(children) == 1:  # the common case, a chain: no new list per node
        return [] if children[0].quarantined else children
    return [c for c in children if not c.quarantined]


def side_groups(forest: Forest) -> list[list[Node]]:
    """Side calls grouped by the topmost side call of their captured lineage (seq order inside)."""
    nodes = forest.links.nodes
    groups: dict[str, list[Node]] = {}
    for node in forest.side:
        top = node
        seen = {id(top)}
        while True:
            parent = nodes.get(top.call.parent_call_id or "")
            if parent is None or parent.side is None or id(parent) in seen:
                break
            seen.add(id(parent))
            top = parent
        groups.setdefault(top.call_id, []).append(node)
    return [groups[k] for k in sorted(groups, key=lambda cid: nodes[cid].order_key)]
