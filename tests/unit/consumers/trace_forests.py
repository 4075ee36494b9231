"""Random rollout forests for the traces properties (hypothesis), with what each root must be classified as.

A forest is grown by a random sequence of actions over conversations (main and sub-agents), so
conversations interleave in creation order: a turn; a turn that launches a sub-agent through an
Agent/Task call (its root opens later, possibly nested); a retry sibling of a call of the current
segment (same parent, same new prompt; continued later or not); a fork from any call of it; a
compaction (a long summary leaf, then a new ROOT or UNRESOLVED root carrying the summary whole or
only its middle ``compaction_min_tokens`` tokens); side calls on a small model. Every token id is
fresh, so a root carries a summary's tokens only where the plan put them. Call ids are drawn, so their order
differs from creation order (it decides retry survivors and ties).

``TraceForest.snapshot(order)`` folds the same calls in a given event order; ``causal_order``
keeps parents before children (the processor verifies a full-prompt claim against calls it has
already seen), ``as_deltas`` stores children as verified deltas, which fold in any order.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from hypothesis import strategies as st

from schemas.hashing import text_digest
from schemas.records import CallCaptured, ParentResolution
from tests.unit.consumers.support import child, declared, root, snapshot_of, unresolved

SIDE_MODEL = "claude-haiku-4"
WIDTH = 16  # RebuildRules().compaction_min_tokens


def agent_items(tool_call_id: str, prompt: str, *, name: str = "Agent", prompt_arg: str = "prompt", **args) -> str:
    """Output items of a call that launches a sub-agent through the ``name`` tool."""
    arguments = json.dumps({prompt_arg: prompt, **args})
    return json.dumps([
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "delegating"}]},
        {"type": "function_call", "call_id": tool_call_id, "name": name, "arguments": arguments},
    ])


def opening(*prompts: str, **facts) -> dict:
    """Facts of a root whose opening message is ``prompts`` (as the interceptor digests it)."""
    return {"tools_present": True, "opening_text_digests": [text_digest(p) for p in prompts], **facts}


def middle(generation: list[int], width: int = WIDTH) -> list[int]:
    start = (len(generation) - width) // 2
    return generation[start:start + width]


@dataclass(frozen=True)
class SubagentRoot:
    root: CallCaptured
    agent_call: CallCaptured  # the call whose Agent/Task tool call started it
    tool_call_id: str
    label: str


@dataclass(frozen=True)
class CompactionRoot:
    root: CallCaptured
    summary: CallCaptured
    segment: int
    label: str


@dataclass
class TraceForest:
    calls: list[CallCaptured]  # creation order
    terminal: CallCaptured
    main_root: CallCaptured
    subagents: list[SubagentRoot]
    compactions: list[CompactionRoot]
    side_ids: set[str]

    def snapshot(self, calls: list[CallCaptured] | None = None):
        return snapshot_of(*(self.calls if calls is None else calls), finish=declared(self.terminal))

    def causal_order(self, priority: list[int]) -> list[CallCaptured]:
        """The calls in ``priority`` order, each one's parent moved before it."""
        by_id = {c.model_call_id: c for c in self.calls}
        out: list[CallCaptured] = []
        seen: set[str] = set()
        for index in priority:
            pending, call = [], self.calls[index]
            while call.model_call_id not in seen:
                pending.append(call)
                seen.add(call.model_call_id)
                if call.parent_call_id is None:
                    break
                call = by_id[call.parent_call_id]
            out += reversed(pending)
        return out

    def as_deltas(self, order: list[int]) -> list[CallCaptured]:
        """The calls in ``order``, every child stored as the verified delta the processor would store."""
        by_id = {c.model_call_id: c for c in self.calls}
        out = []
        for index in order:
            call = self.calls[index]
            if call.parent_resolution is ParentResolution.RESOLVED:
                cut = by_id[call.parent_call_id].cum_len
                call = dataclasses.replace(call, prompt_token_ids=call.prompt_token_ids[cut:], prompt_is_delta=True)
            out.append(call)
        return out


@dataclass
class _Conversation:
    label: str
    head: CallCaptured
    tree: list[CallCaptured]  # the current segment's calls (fork points)
    segment: int = 0
    blocked: bool = False  # its summary is written, the next segment's root not yet


@dataclass
class _Grower:
    draw: object
    calls: list[CallCaptured] = field(default_factory=list)
    parent: dict[str, CallCaptured] = field(default_factory=dict)
    launching: set[str] = field(default_factory=set)  # calls that hold an Agent/Task tool call
    pending: list[tuple] = field(default_factory=list)
    subagents: list[SubagentRoot] = field(default_factory=list)
    compactions: list[CompactionRoot] = field(default_factory=list)
    side_ids: set[str] = field(default_factory=set)
    next_token: int = 1000

    def fresh(self, low: int, high: int) -> list[int]:
        n = self.draw(st.integers(low, high))
        self.next_token += n
        return list(range(self.next_token - n, self.next_token))

    def ident(self) -> dict:
        # A drawn prefix: call-id order is not creation order.
        n = len(self.calls)
        return {"call_id": f"{self.draw(st.integers(0, 0xFF)):02x}{n:030x}", "created_at": float(n + 1)}

    def add(self, call: CallCaptured, parent: CallCaptured | None = None) -> CallCaptured:
        self.calls.append(call)
        if parent is not None:
            self.parent[call.model_call_id] = parent
        return call

    def turn(self, conv: _Conversation, **kw) -> CallCaptured:
        call = self.add(child(conv.head, self.fresh(1, 2), self.fresh(1, 3), **self.ident(), **kw), conv.head)
        conv.head = call
        conv.tree.append(call)
        return call

    def launch(self, conv: _Conversation) -> None:
        prompt = f"sub-task {len(self.pending) + len(self.subagents)}: look into part {len(self.calls)}"
        tool_call_id = f"toolu_{len(self.calls)}"
        label = self.draw(st.sampled_from(["Explore", "Plan", "general-purpose", None]))
        args = {"subagent_type": label, "description": "d"} if label else {"description": f"describe {len(self.calls)}"}
        name = self.draw(st.sampled_from(["Agent", "Task"]))
        call = self.turn(conv, output_items_json=agent_items(tool_call_id, prompt, name=name, **args))
        self.launching.add(call.model_call_id)
        self.pending.append(("subagent", call, tool_call_id, prompt, label or args["description"]))

    def retry(self, conv: _Conversation) -> None:
        # Roots and Agent calls are not retried here: their identity would move with the survivor.
        candidates = [c for c in conv.tree if c.model_call_id in self.parent and c.model_call_id not in self.launching]
        if not candidates:
            return
        call = self.draw(st.sampled_from(candidates))
        parent = self.parent[call.model_call_id]
        extra = call.prompt_token_ids[parent.cum_len:]  # the same new prompt, another generation
        self.add(child(parent, extra, self.fresh(1, 3), **self.ident()), parent)

    def fork(self, conv: _Conversation) -> None:
        point = self.draw(st.sampled_from(conv.tree))
        branch = self.add(child(point, self.fresh(1, 2), self.fresh(1, 3), **self.ident()), point)
        conv.tree.append(branch)
        if self.draw(st.booleans()):
            conv.tree.append(self.add(child(branch, self.fresh(1, 1), self.fresh(1, 2), **self.ident()), branch))

    def compact(self, conv: _Conversation) -> None:
        summary = self.add(child(conv.head, self.fresh(1, 2), self.fresh(WIDTH, WIDTH + 8), **self.ident()), conv.head)
        conv.blocked = True
        self.pending.append(("compaction", conv, summary))

    def side(self) -> None:
        first = self.add(root(self.fresh(1, 3), self.fresh(1, 3), requested_model=SIDE_MODEL, **self.ident()))
        self.side_ids.add(first.model_call_id)
        if self.draw(st.booleans()):
            second = self.add(child(first, self.fresh(1, 1), self.fresh(1, 2), requested_model=SIDE_MODEL,
                                    **self.ident()), first)
            self.side_ids.add(second.model_call_id)

    def open(self, convs: list[_Conversation], item: tuple) -> None:
        if item[0] == "subagent":
            _, agent_call, tool_call_id, prompt, label = item
            call = self.add(root(self.fresh(1, 3), self.fresh(1, 3), facts=opening(prompt), **self.ident()))
            convs.append(_Conversation(label, call, [call]))
            self.subagents.append(SubagentRoot(call, agent_call, tool_call_id, label))
            return
        _, conv, summary = item
        make = unresolved if self.draw(st.booleans()) else root
        carried = summary.generation_token_ids if self.draw(st.booleans()) else middle(summary.generation_token_ids)
        prompt = [*self.fresh(1, 3), *carried, *self.fresh(0, 2)]
        call = self.add(make(prompt, self.fresh(1, 3), **self.ident()))
        conv.head, conv.tree, conv.segment, conv.blocked = call, [call], conv.segment + 1, False
        self.compactions.append(CompactionRoot(call, summary, conv.segment, conv.label))


ACTIONS = ("turn", "turn", "launch", "open", "open", "retry", "retry", "fork", "compact", "compact", "side")


@st.composite
def trace_forests(draw, min_actions: int = 6, max_actions: int = 30) -> TraceForest:
    grower = _Grower(draw)
    first = grower.add(root(grower.fresh(2, 4), grower.fresh(1, 3), **grower.ident()))
    convs = [_Conversation("main", first, [first])]
    for action in draw(st.lists(st.sampled_from(ACTIONS), min_size=min_actions, max_size=max_actions)):
        if action == "side":
            grower.side()
            continue
        if action == "open":
            if grower.pending:
                grower.open(convs, grower.pending.pop(draw(st.integers(0, len(grower.pending) - 1))))
            continue
        free = [c for c in convs if not c.blocked]
        if not free:
            continue
        conv = draw(st.sampled_from(free))
        getattr(grower, action)(conv)
    while grower.pending:  # every launched sub-agent and written summary opens, after everything else
        grower.open(convs, grower.pending.pop(0))
    return TraceForest(calls=grower.calls, terminal=convs[0].head, main_root=first, subagents=grower.subagents,
                       compactions=grower.compactions, side_ids=grower.side_ids)


__all__ = ["CompactionRoot", "SubagentRoot", "TraceForest", "agent_items", "middle", "opening", "trace_forests"]
