"""Who each root of a rollout's policy forest is: main, sub-agent, compaction segment, or unknown (pure).

A root is a call whose prompt extends no earlier call: the harness's first turn,
a sub-agent's opening, the first turn after a compaction, or something nothing
explains. Evidence, strongest first (``classified_by``):

1. ``declared``: the harness declared the call's trace (``CallFacts.trace_declared``,
   the ``x-tokentrail-trace`` header: ``main``, ``subagent[:label]``,
   ``compaction``, ``side[:label]``, ``other[:label]``). It decides the kind; the
   evidence below may still find the attachment.
2. ``agent_tool``: the root's opening message (``CallFacts.opening_text_digests``)
   is the ``prompt`` (Codex: ``message``) argument of exactly one earlier
   sub-agent tool call (``rules.subagent_tools``: Agent, Task, spawn_agent) of
   another tree: a sub-agent, labelled with the call's ``subagent_type`` or
   ``agent_type`` (else ``description``, else the tool name), attached to that
   call and tool call id.
3. ``agent_header``: the harness named an agent for the call in its own headers
   (``CallFacts.agent_name``): a sub-agent with that label, attachment unknown.
4. ``summary``: the root's prompt carries the middle or one of 8 evenly spaced
   ``rules.compaction_min_tokens``-token windows of an earlier leaf's
   generation (a call nothing continued, in another tree; generations shorter
   than a window never count; several windows because a harness may keep only
   part of the summary, e.g. Claude Code drops its thinking). Of several such
   leaves the latest is the summary (a harness summarises right before it
   restarts; preserved turns and sub-agent answers it also carries are older):
   compaction segment k+1 of that leaf's conversation. Limit: a summary whose
   kept part holds no whole window (a one-line summary after dropped thinking)
   is not found; the segment then links to an older carried leaf, if any (its
   tokens are delivered all the same, the attachment names the wrong call), else
   it is unclassified.
5. ``terminal``: the earliest segment of the terminal's conversation is ``main``.

Anything else is ``other`` with ``trace_unclassified``; evidence that points at
two parents is ``trace_ambiguous``: the kind is kept when all candidates agree
on it, the parent is never guessed. Guarantee: the result depends on the set of
calls, not their order (every choice is over (created_at, call id) order).
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field

from consumers.rebuild.links import Node
from consumers.rebuild.rules import RebuildRules
from schemas.hashing import text_digest
from schemas.records import MaskCode, MaskReason, TraceKind

_LABELLED = {k.value for k in TraceKind}
# Where the harnesses put a sub-agent's opening message and its type: Claude Code's Agent/Task
# ``prompt`` and ``subagent_type`` (else ``description``), Codex's spawn_agent ``message`` and
# ``agent_type``.
_PROMPT_ARGS = ("prompt", "message")
_LABEL_ARGS = ("subagent_type", "agent_type", "description")


@dataclass(slots=True)
class RootIdentity:
    kind: TraceKind
    label: str
    classified_by: str
    segment: int = 0
    parent: Node | None = None  # the call this trace hangs off (the Agent/Task call, the summary call)
    tool_call_id: str | None = None
    reasons: list[MaskReason] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _AgentCall:
    node: Node
    tool_call_id: str
    label: str
    prompt_digest: str


def classify_roots(roots: list[Node], live: list[Node], terminal: Node | None,
                   rules: RebuildRules) -> tuple[dict[int, RootIdentity], list[MaskReason]]:
    """``id(root) -> identity`` for every live root, and the rollout-level reasons (conflicting mains)."""
    tree_of = _tree_of(live)
    agent_calls = _agent_calls(live, rules.subagent_tools)
    leaves = _Leaves(live)
    ordered = sorted(roots, key=lambda n: n.order_key)
    out: dict[int, RootIdentity] = {}
    for root in ordered:
        out[id(root)] = _classify(root, tree_of, agent_calls, leaves, rules)
    reasons = _assign_main(ordered, out, tree_of, terminal)
    for root in ordered:  # creation order: a segment's parent conversation is labelled before it
        ident = out[id(root)]
        if ident.kind is TraceKind.COMPACTION and ident.parent is not None:
            parent = out[id(tree_of[id(ident.parent)])]
            ident.segment = parent.segment + 1
            if ident.classified_by != "declared" or not ident.label:
                ident.label = parent.label
    return out, reasons


def carried_summaries(roots: list[Node], live: list[Node], rules: RebuildRules) -> list[Node]:
    """The calls a later root carries as its summary (before retry resolution).

    Retry resolution keeps a sibling that something continued; a summary is
    continued by the segment that carries it, not by a child, so the builder
    pins these before resolving retries.
    """
    tree_of = _tree_of(live)
    leaves = _Leaves(live)
    found = []
    for root in roots:
        matches = _summaries(root, tree_of, leaves, rules)
        if len(matches) == 1:
            found.append(matches[0])
    return found


def _classify(root: Node, tree_of: dict[int, Node], agent_calls: list[_AgentCall], leaves: _Leaves,
              rules: RebuildRules) -> RootIdentity:
    declared = _declared(root.call.facts.trace_declared)
    tool_matches = _tool_matches(root, tree_of, agent_calls)
    if declared is not None:
        kind, label = declared
        ident = RootIdentity(kind, label, "declared")
        if kind is TraceKind.SUBAGENT and len(tool_matches) == 1:
            ident.parent, ident.tool_call_id = tool_matches[0].node, tool_matches[0].tool_call_id
            ident.label = ident.label or tool_matches[0].label
        elif kind is TraceKind.COMPACTION:
            summaries = _summaries(root, tree_of, leaves, rules)
            ident.parent = summaries[0] if len(summaries) == 1 else None
        return ident
    if len(tool_matches) == 1:
        match = tool_matches[0]
        return RootIdentity(TraceKind.SUBAGENT, match.label, "agent_tool", parent=match.node,
                            tool_call_id=match.tool_call_id)
    if len(tool_matches) > 1:
        labels = sorted({m.label for m in tool_matches})
        ids = sorted({m.node.call_id for m in tool_matches})
        return RootIdentity(TraceKind.SUBAGENT, labels[0] if len(labels) == 1 else "", "agent_tool", reasons=[
            MaskReason(code=MaskCode.TRACE_AMBIGUOUS, call_ids=[root.call_id, *ids],
                       detail=f"call {root.call_id} opens with the prompt of {len(tool_matches)} Agent/Task calls; "
                              "which one started it is not known")])
    if root.call.facts.agent_name:
        return RootIdentity(TraceKind.SUBAGENT, root.call.facts.agent_name, "agent_header")
    summaries = _summaries(root, tree_of, leaves, rules)
    if len(summaries) == 1:
        return RootIdentity(TraceKind.COMPACTION, "", "summary", parent=summaries[0])
    if summaries:
        ids = [s.call_id for s in summaries]
        return RootIdentity(TraceKind.COMPACTION, "", "summary", reasons=[
            MaskReason(code=MaskCode.TRACE_AMBIGUOUS, call_ids=[root.call_id, *ids],
                       detail=f"call {root.call_id} carries the generations of {len(ids)} earlier calls made at "
                              "the same instant; which summary it continues from is not known")])
    return RootIdentity(TraceKind.OTHER, "root", "none")


def _assign_main(ordered: list[Node], out: dict[int, RootIdentity], tree_of: dict[int, Node],
                 terminal: Node | None) -> list[MaskReason]:
    """The terminal's earliest segment is ``main``; a declared main elsewhere is a conflict."""
    declared_mains = [r for r in ordered if out[id(r)].kind is TraceKind.MAIN]
    first = None
    if terminal is not None:
        first = tree_of[id(terminal)]
        seen = {id(first)}
        while (ident := out[id(first)]).kind is TraceKind.COMPACTION and ident.parent is not None:
            first = tree_of[id(ident.parent)]
            if id(first) in seen:
                break
            seen.add(id(first))
    reasons = []
    if first is not None and out[id(first)].kind is TraceKind.OTHER and not out[id(first)].reasons:
        out[id(first)] = RootIdentity(TraceKind.MAIN, "main", "terminal")
    elif first is not None and out[id(first)].kind is not TraceKind.MAIN:
        reasons.append(MaskReason(code=MaskCode.TRACE_AMBIGUOUS, call_ids=[first.call_id],
                                  detail=f"the terminal's conversation starts at call {first.call_id}, "
                                         f"which the evidence says is a {out[id(first)].kind.value} trace"))
    others = [r for r in declared_mains if r is not first]
    if others and (first is not None or len(declared_mains) > 1):
        reasons.append(MaskReason(code=MaskCode.TRACE_AMBIGUOUS, call_ids=sorted(r.call_id for r in others),
                                  detail=f"{len(declared_mains)} call(s) declared main besides the terminal's "
                                         "conversation; which is the rollout's is not known"))
    for root in ordered:
        ident = out[id(root)]
        if ident.kind is TraceKind.MAIN and not ident.label:
            ident.label = "main"
        if ident.kind is TraceKind.OTHER and ident.classified_by == "none":
            ident.reasons.append(MaskReason(
                code=MaskCode.TRACE_UNCLASSIFIED, call_ids=[root.call_id],
                detail=f"call {root.call_id} starts a conversation that no declaration, Agent/Task call, agent "
                       "header or carried summary explains"))
    return reasons


def _declared(value: str) -> tuple[TraceKind, str] | None:
    if not value:
        return None
    kind, _, label = value.partition(":")
    if kind not in _LABELLED:
        return None  # the interceptor refuses these; a record from elsewhere is treated as undeclared
    return TraceKind(kind), label


def _tree_of(live: list[Node]) -> dict[int, Node]:
    """``id(node) -> its root`` (iterative, memoised)."""
    root_of: dict[int, Node] = {}
    for node in live:
        path, cur = [], node
        while cur.parent is not None and id(cur) not in root_of:
            path.append(cur)
            cur = cur.parent
        top = root_of.get(id(cur), cur)
        root_of[id(cur)] = top
        for n in path:
            root_of[id(n)] = top
    return root_of


def _agent_calls(live: list[Node], tools: tuple[str, ...]) -> list[_AgentCall]:
    """Every Agent/Task tool call the policy generated (non-quarantined calls), with its prompt's digest."""
    wanted = set(tools)
    found: list[_AgentCall] = []
    for node in live:
        if node.quarantined or not wanted:
            continue
        raw = node.call.output_items_json
        if not any(f'"{name}"' in raw for name in wanted):
            continue  # most calls make no Agent call: skip the parse
        try:
            items = json.loads(raw)
        except ValueError:
            continue
        for item in items if isinstance(items, list) else ():
            if not (isinstance(item, dict) and item.get("type") == "function_call" and item.get("name") in wanted):
                continue
            try:
                args = json.loads(item.get("arguments") or "")
            except (TypeError, ValueError):
                continue
            if not isinstance(args, dict):
                continue
            prompt = next((args[k] for k in _PROMPT_ARGS if isinstance(args.get(k), str)), None)
            if prompt is not None and prompt.strip():
                label = next((args[k] for k in _LABEL_ARGS if isinstance(args.get(k), str) and args[k]), item["name"])
                found.append(_AgentCall(node, str(item.get("call_id") or ""), str(label), text_digest(prompt)))
    return found


def _tool_matches(root: Node, tree_of: dict[int, Node], agent_calls: list[_AgentCall]) -> list[_AgentCall]:
    opening = set(root.call.facts.opening_text_digests)
    if not opening:
        return []
    return sorted((c for c in agent_calls if c.prompt_digest in opening and tree_of[id(c.node)] is not root
                   and c.node.order_key < root.order_key),
                  key=lambda c: (c.node.order_key, c.tool_call_id))


def _summaries(root: Node, tree_of: dict[int, Node], leaves: _Leaves, rules: RebuildRules) -> list[Node]:
    """The summary ``root`` continues from: the latest carried leaf (two only when created at once).

    A harness summarises right before it restarts; whatever else the new prompt
    keeps (preserved turns, a sub-agent's answer as a tool result) was generated
    before the summary. Two carried leaves created at the same instant cannot be
    ordered: both are returned and the segment is ambiguous.
    """
    found = _summary_matches(root, tree_of, leaves, rules.compaction_min_tokens)
    if len(found) < 2:
        return found
    latest = max(n.call.created_at for n in found)
    return [n for n in found if n.call.created_at == latest]


_WINDOWS = 8  # evenly spaced windows tried per generation, with the middle one: a harness may drop part of it


class _Leaves:
    """The live calls nothing live continues, and their generation windows as bytes.

    Every root is matched against every earlier leaf: each window is packed once per
    classification (on first use, in the order the search asks for it), not once per root.
    """

    def __init__(self, live: list[Node]) -> None:
        self.nodes = [n for n in live if not n.quarantined and not any(not c.quarantined for c in n.children)]
        self._packed: dict[tuple[int, int, int], bytes] = {}
        self._starts: dict[tuple[int, int], list[int]] = {}

    def windows(self, leaf: Node, width: int) -> Iterator[bytes]:
        """The leaf's windows, packed as the search asks for them (their starts worked out once per leaf)."""
        starts = self._starts.get((id(leaf), width))
        if starts is None:
            last = len(leaf.generation) - width
            starts = self._starts[id(leaf), width] = sorted({last // 2, *(last * k // (_WINDOWS - 1)
                                                                          for k in range(_WINDOWS))})
        for start in starts:
            yield self.window(leaf, start, width)

    def window(self, leaf: Node, start: int, width: int) -> bytes:
        key = (id(leaf), start, width)
        packed = self._packed.get(key)
        if packed is None:
            packed = self._packed[key] = array("I", leaf.generation[start:start + width]).tobytes()
        return packed


def _summary_matches(root: Node, tree_of: dict[int, Node], leaves: _Leaves, width: int) -> list[Node]:
    """Earlier leaves of other trees one of whose generation windows the root's prompt carries."""
    prompt = root.call.prompt_token_ids
    if not prompt:
        return []
    haystack = array("I", prompt).tobytes()
    found = []
    root_key = root.order_key
    for leaf in leaves.nodes:
        generation = leaf.generation
        if tree_of[id(leaf)] is root or leaf.order_key >= root_key or len(generation) < width:
            continue  # a generation shorter than the window is too short to tell a summary from a coincidence
        if any(_contains(haystack, window) for window in leaves.windows(leaf, width)):
            found.append(leaf)
    return found


def _contains(haystack: bytes, needle: bytes) -> bool:
    """``needle`` at a 4-byte-aligned offset of ``haystack`` (token boundaries, not byte coincidences)."""
    at = haystack.find(needle)
    while at != -1:
        if at % 4 == 0:
            return True
        at = haystack.find(needle, at + 1)
    return False
