"""Terminal attribution: which captured call produced the harness's final answer (pure).

Precedence (each method only if ``rules.terminal_methods`` allows it):

1. ``declared``: the final response id names the call (the interceptor embeds
   the model call id in every response id; an id recorded verbatim in a call's
   facts also counts). A declared call that was not captured, produced no
   tokens, or is a side call ends in a mask: the evidence points elsewhere and
   nothing is guessed. An id that names no call and has no call id in it is
   reported and ignored.
2. ``content``: exactly one policy call's output text equals the final text
   (whitespace-normalised). Several matches are reported and fall through.
3. ``heuristic``: from the earliest extended root (a root with a live child;
   the only root when none is extended; several unextended roots are
   ambiguous), descend while exactly one child is
   extended (or, at the end, exactly one child remains); any other fork is
   ambiguous, and so is an unlinked fragment (a root at an unresolved boundary)
   besides the chosen root: the conversation went on where we cannot follow.
   Reported as ``single_chain`` when the policy forest has one chain. Runs
   after retry resolution, so abandoned retries are out of the way.

Evidence attribution (1, 2) runs before retry resolution: the attributed call
and its ancestors are pinned, which resolves a final-call retry the heuristic
could not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from consumers.rebuild.graph import Forest, live_children
from consumers.rebuild.links import Node
from schemas.ids import call_id_from_response_id
from schemas.records import MaskCode, RolloutFinished


@dataclass(slots=True)
class Attribution:
    node: Node | None = None
    method: str = "none"
    failure: MaskCode | None = None  # mask code when attribution failed
    detail: str = ""
    notes: dict[str, Any] = field(default_factory=dict)  # evidence report for detail_json


def attribute_by_evidence(forest: Forest, finished: RolloutFinished, methods: tuple[str, ...]) -> Attribution:
    """Declared, then content attribution; an empty Attribution when neither applies."""
    out = Attribution()
    if "declared" in methods and finished.final_response_id:
        _declared(forest, finished.final_response_id, out)
        if out.node is not None or out.failure is not None:
            return out
    if "content" in methods and finished.final_text and finished.final_text.strip():
        _content(forest, finished.final_text, out)
    return out


def _declared(forest: Forest, response_id: str, out: Attribution) -> None:
    nodes = forest.links.nodes
    call_id = call_id_from_response_id(response_id)
    if call_id is None:
        matches = sorted(cid for cid, n in nodes.items() if n.call.facts.response_id == response_id)
        call_id = matches[0] if len(matches) == 1 else None
    out.notes["declared_response_id"] = response_id
    if call_id is None:
        out.notes["declared"] = "unrecognised"  # not one of our ids: ignored, reported
        return
    out.notes["declared_call_id"] = call_id
    node = nodes.get(call_id)
    if node is None:
        out.failure, out.detail = MaskCode.TERMINAL_NOT_CAPTURED, f"final response {response_id} names call {call_id}, which was not captured"
    elif not node.generation:
        out.failure, out.detail = MaskCode.TERMINAL_EMPTY, f"declared terminal call {call_id} generated no tokens"
    elif node.side is not None:
        out.failure, out.detail = MaskCode.TERMINAL_IS_SIDE_CALL, f"declared terminal call {call_id} is a side call ({node.side.rule})"
    else:
        out.node, out.method = node, "declared"


def _content(forest: Forest, final_text: str, out: Attribution) -> None:
    want = _normalise(final_text)
    matches = [n for n in forest.live if _normalise(output_text(n.call.output_items_json)) == want]
    out.notes["content_matches"] = sorted(n.call_id for n in matches)
    if len(matches) == 1:
        out.node, out.method = matches[0], "content"


def attribute_by_heuristic(forest: Forest, n_chains: int) -> Attribution:
    """The unique extended leaf from the earliest extended root, or an ambiguity."""
    roots = [r for r in forest.roots if not r.quarantined]
    if not roots:
        return Attribution(failure=MaskCode.NO_TERMINAL, detail="no live root to start from")
    extended = [r for r in roots if live_children(r)]
    if not extended and len(roots) > 1:
        # Several one-call conversations and nothing says which answered the harness:
        # the earliest could be a title or probe call (NeMo Gym's "aux-first" limitation).
        ids = sorted(r.call_id for r in roots)
        return Attribution(
            failure=MaskCode.TERMINAL_AMBIGUOUS,
            detail=f"no evidence names the terminal and {len(ids)} single-call roots could hold it",
            notes={"ambiguous_children": ids},
        )
    node = min(extended or roots, key=lambda n: n.order_key)
    fragments = sorted(r.call_id for r in roots if r.boundary is not None and r is not node)
    if fragments:
        # The conversation went on past a link we could not verify (compaction, drift):
        # the final answer may be in that fragment, so the earliest root is a guess.
        return Attribution(
            failure=MaskCode.TERMINAL_AMBIGUOUS,
            detail=f"no evidence names the terminal and {len(fragments)} unlinked fragment(s) may hold it",
            notes={"ambiguous_children": fragments},
        )
    kids = live_children(node)
    while kids:
        if len(kids) == 1:  # a chain: the one child, grown or the last
            node = kids[0]
            kids = live_children(node)
            continue
        below = [live_children(k) for k in kids]  # each node's live children are listed once on the way down
        grown = [(k, g) for k, g in zip(kids, below) if g]
        if len(grown) == 1:
            node, kids = grown[0]
        elif not grown and len(kids) == 1:
            node, kids = kids[0], []
        else:
            forks = sorted(k.call_id for k in ([k for k, _ in grown] or kids))
            return Attribution(
                failure=MaskCode.TERMINAL_AMBIGUOUS,
                detail=f"call {node.call_id} continues into {len(forks)} branches and no evidence names one",
                notes={"ambiguous_children": forks},
            )
    return Attribution(node=node, method="single_chain" if n_chains == 1 else "heuristic")


def output_text(output_items_json: str) -> str:
    """The text a call showed the harness: its message items' text parts, concatenated."""
    try:
        items = json.loads(output_items_json)
    except ValueError:
        return ""
    parts: list[str] = []
    for item in items if isinstance(items, list) else ():
        if not isinstance(item, dict) or item.get("type", "message") != "message":
            continue
        content = item.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str))
    return "".join(parts)


def _normalise(text: str) -> str:
    return " ".join(text.split())
