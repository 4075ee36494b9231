"""A rollout's verified forest as labelled traces (pure): ``delivery_mode="traces"``.

Each tree of the policy forest (after retry resolution) is cut into root-to-leaf
traces. The first trace of a tree, its trunk, ends at the terminal (main), else
at the summary call a later segment continues from, else at the latest leaf.
Every other chain that still holds calls no trace owns becomes a fork trace
(``other``), whose prefix up to the fork is the owning trace's (compact tree
form: ``prefix_trace``, ``prefix_len``). Tree kinds and labels come from
``consumers.rebuild.identity``; side calls become ``side`` traces without
tokens (they are not the policy's).

Guarantees:
- every generated token of a non-quarantined policy call is loss-bearing in
  exactly one trace (a summary's only when ``rules.train_summaries``), and no
  other token is;
- every trace with a trajectory is contiguous and token-exact: the whole path is
  rebuilt and checked against the last call's digest (``chain_spans``, then
  ``chain_tokens``: ``chain_trajectory`` in two halves);
- the traces, their order and their bytes depend on the set of calls and the
  rules, not on the order of events.

A trace that cannot be trusted carries ``mask_sample`` with its reasons:
identity (``trace_unclassified``, ``trace_ambiguous``), an unresolved parent at
its root (not one a summary explains), an unresolved retry among its calls, or
a chain error. ``rollout_reasons`` turns the masked traces of the kinds in
``rules.mask_rollout_kinds`` into ``trace_masked`` on the rollout.
"""

from __future__ import annotations

from consumers.rebuild.graph import Forest, ancestry, chains, side_groups
from consumers.rebuild.identity import RootIdentity, classify_roots
from consumers.rebuild.links import Node
from consumers.rebuild.projection import project_response_json
from consumers.rebuild.rules import RebuildRules
from consumers.rebuild.trajectory import ChainError, chain_spans, chain_tokens
from schemas.records import CallSpan, MaskCode, MaskReason, Trace, TraceAttachment, TraceKind, Trajectory


def build_traces(forest: Forest, terminal: Node | None, unresolved_retries: list[list[str]], rules: RebuildRules,
                 rollout_id: str, known: dict[int, Trajectory] | None = None) -> tuple[list[Trace], list[MaskReason]]:
    """Every trace of the forest, and the rollout-level identity reasons.

    ``known`` maps ``id(last node)`` of an already rebuilt root-to-node path to
    its trajectory (the delivered chain), so it is not rebuilt twice.
    """
    roots = [r for r in forest.roots if not r.quarantined]
    identities, reasons = classify_roots(roots, forest.live, terminal, rules)
    summaries = {id(i.parent) for i in identities.values() if i.kind is TraceKind.COMPACTION and i.parent is not None}
    retried = {cid: group for group in unresolved_retries for cid in group}
    untrained = set() if rules.train_summaries else summaries
    known = dict(known or {})
    owner: dict[int, int] = {}  # id(node) -> index of the trace that trains on it
    plans: list[tuple[list[Node], int, RootIdentity, Node]] = []  # (path, own_from, identity, root)
    for root in sorted(roots, key=lambda r: (identities[id(r)].kind is not TraceKind.MAIN, r.order_key)):
        tree_chains = chains(forest, [root])
        trunk = ancestry(_trunk_target(tree_chains, terminal, summaries))
        for path in [trunk, *tree_chains]:
            own_from = next((i for i, n in enumerate(path) if id(n) not in owner), None)
            if own_from is None:
                continue
            for node in path[own_from:]:
                owner[id(node)] = len(plans)
            plans.append((path, own_from, identities[id(root)], root))
    # Every path's spans before any path's per-token arrays: the spans' allocations would otherwise start
    # garbage collections that walk the young token lists of the traces built before them (docs/perf/consumer.md).
    spans: dict[int, list[CallSpan] | Exception] = {}
    for path, *_ in plans:
        if id(path[-1]) not in known and id(path[-1]) not in spans:
            try:
                spans[id(path[-1])] = chain_spans(path)
            except Exception as exc:  # raised again where the trace is built, as chain_trajectory raised it there
                spans[id(path[-1])] = exc
    traces = [_trace(index, plan, plans, owner, identities, retried, untrained, rules, rollout_id, known, spans)
              for index, plan in enumerate(plans)]
    for group in side_groups(forest):
        first = group[0]
        traces.append(Trace(kind=TraceKind.SIDE.value, label=first.side.rule if first.side else "", classified_by="side_rule",
                            call_ids=[n.call_id for n in group]))
    return traces, reasons


def rollout_reasons(traces: list[Trace], rules: RebuildRules) -> list[MaskReason]:
    """``trace_masked`` for each masked trace whose kind masks the rollout."""
    out = []
    for index, trace in enumerate(traces):
        if trace.mask_sample and trace.kind in rules.mask_rollout_kinds:
            codes = ", ".join(sorted({r.code for r in trace.mask_reasons}))
            out.append(MaskReason(code=MaskCode.TRACE_MASKED, call_ids=list(trace.call_ids),
                                  detail=f"trace {index} ({trace.kind} {trace.label}) is masked: {codes}"))
    return out


def _trunk_target(tree_chains: list[list[Node]], terminal: Node | None, summaries: set[int]) -> Node:
    nodes = [n for chain in tree_chains for n in chain]
    if terminal is not None and any(n is terminal for n in nodes):
        return terminal
    linked = [n for n in nodes if id(n) in summaries]
    if linked:
        return max(linked, key=lambda n: n.order_key)
    return max((chain[-1] for chain in tree_chains), key=lambda n: n.order_key)


def _trace(index: int, plan: tuple[list[Node], int, RootIdentity, Node],
           plans: list[tuple[list[Node], int, RootIdentity, Node]], owner: dict[int, int],
           identities: dict[int, RootIdentity], retried: dict[str, list[str]], untrained: set[int],
           rules: RebuildRules, rollout_id: str, known: dict[int, Trajectory],
           spans: dict[int, list[CallSpan] | Exception]) -> Trace:
    path, own_from, ident, root = plan
    own = path[own_from:]
    reasons = list(ident.reasons)
    if root.boundary is not None and not (ident.kind is TraceKind.COMPACTION and ident.parent is not None):
        reasons.append(MaskReason(code=MaskCode.UNRESOLVED_PARENT, call_ids=[root.call_id],
                                  detail=f"the trace starts at call {root.call_id}, whose parent is unknown ({root.boundary})"))
    groups = sorted({tuple(retried[n.call_id]) for n in own if n.call_id in retried})
    for group in groups:
        reasons.append(MaskReason(code=MaskCode.UNRESOLVED_RETRY, call_ids=list(group),
                                  detail="a call of this trace was retried and nothing says which retry was kept"))
    trajectory = response = None
    try:
        full = known.get(id(path[-1])) or _trajectory(path, spans)
        known[id(path[-1])] = full
        trajectory = _own_part(full, own_from, {n.call_id for n in own if id(n) in untrained})
        if rules.project_response:
            response = project_response_json(_with_prefix(path, own_from, full), rollout_id)
    except Exception as exc:  # ChainError, or a malformed record: this trace is not deliverable
        trajectory = response = None
        code = exc.code if isinstance(exc, ChainError) else MaskCode.BUILD_ERROR
        reasons.append(MaskReason(code=code, detail=f"{type(exc).__name__}: {exc}", call_ids=[n.call_id for n in own]))
    fork = path[own_from - 1] if own_from else None
    attachment: TraceAttachment | None
    if fork is not None:
        kind, label, classified_by, segment = TraceKind.OTHER, f"{ident.label}/fork", "fork", ident.segment
        parent_trace, attachment = owner[id(fork)], TraceAttachment(call_id=fork.call_id)
    else:
        kind, label, classified_by, segment = ident.kind, ident.label, ident.classified_by, ident.segment
        parent_trace = owner[id(ident.parent)] if ident.parent is not None and id(ident.parent) in owner else -1
        attachment = (TraceAttachment(call_id=ident.parent.call_id, tool_call_id=ident.tool_call_id)
                      if ident.parent is not None else None)
    return Trace(
        kind=kind.value, label=label, segment=segment, parent_trace=parent_trace, attachment=attachment,
        classified_by=classified_by, prefix_trace=owner[id(fork)] if fork is not None else -1,
        prefix_len=fork.call.cum_len if fork is not None else 0, trajectory=trajectory, response_json=response,
        call_ids=[n.call_id for n in own], loss_tokens=len(trajectory.log_probs) if trajectory is not None else 0,
        mask_sample=bool(reasons), mask_reasons=reasons,
    )


def _trajectory(path: list[Node], spans: dict[int, list[CallSpan] | Exception]) -> Trajectory:
    """``chain_trajectory(path)``, from the spans (or the error) ``build_traces`` made first."""
    made = spans.pop(id(path[-1]), None)
    if isinstance(made, Exception):
        raise made
    return chain_tokens(path, made if made is not None else chain_spans(path))


def _own_part(full: Trajectory, own_from: int, untrained: set[str]) -> Trajectory:
    """The trace's own tokens of a whole-path trajectory; summaries not trained on become context."""
    if own_from == 0 and not untrained:
        return full  # the whole path, every generation trained on: what the slicing below would copy
    spans = full.spans[own_from:]
    cut = spans[0].start
    mask = bytearray(full.loss_mask[cut:])
    first = full.loss_mask.count(1, 0, cut)  # log-probs of the shared prefix's generations
    log_probs: list[float] = []
    at = first
    for span in spans:
        n = span.end - span.generation_start
        if span.model_call_id in untrained:
            mask[span.generation_start - cut:span.end - cut] = bytes(n)
        else:
            log_probs += full.log_probs[at:at + n]
        at += n
    return Trajectory(token_ids=full.token_ids[cut:], loss_mask=bytes(mask), log_probs=log_probs,
                      prompt_len=spans[0].generation_start, spans=spans)


def _with_prefix(path: list[Node], own_from: int, full: Trajectory) -> list[Node]:
    """The trace's own calls, the first one's prompt being the whole shared prefix (for the projection)."""
    if own_from == 0:
        return path
    first = path[own_from]
    head = Node(first.call, first.seq, first.late, first.note, full.token_ids[:full.spans[own_from].generation_start])
    return [head, *path[own_from + 1:]]
