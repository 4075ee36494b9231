"""A tree-shaped rollout for ``tokentrail bench rebuild``: a main chain, sub-agents, compactions.

A private helper of ``compose.tools.bench.rebuild`` (the leading underscore keeps it
out of the ``tokentrail bench`` list).

``synth_tree_snapshot(n_calls, n_tokens)`` folds, through the real processor
fold (``processors.fold``), one rollout shaped like a Claude Code session:

- a main conversation in ``compactions + 1`` segments: every segment but the
  last ends with a summary call (a leaf continuing the segment's last call),
  and the next segment is a new root whose full prompt carries that summary's
  whole generation (``consumers.rebuild.identity``: ``summary`` evidence);
- ``subagents`` sub-agents, each a chain of its own root, started by an
  ``Agent`` function call in a main call's output items: the root's
  ``facts.opening_text_digests`` holds ``text_digest`` of that call's
  ``prompt`` argument (``agent_tool`` evidence);
- the final answer declared by response id on the last main call (the
  terminal), so terminal mode delivers the last segment.

Guarantees: ``n_calls`` calls in all; the unique tokens (each call's new
prompt tokens plus its generation, a root's prompt counted whole) sum to
exactly ``n_tokens``; every token sequence is drawn from a seeded generator, so
the build is deterministic and no 16-token run of one call's generation
appears in an unrelated prompt by chance. ``unique_tokens(snapshot)`` recounts
that total from the snapshot alone.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any

VOCAB = 150_000
SUMMARY_MIN_TOKENS = 16  # RebuildRules.compaction_min_tokens' default: a shorter summary is never matched


def min_calls(subagents: int, compactions: int) -> int:
    """The fewest calls the shape needs: two per main segment, one per sub-agent."""
    return 2 * (compactions + 1) + subagents


def synth_tree_snapshot(n_calls: int, n_tokens: int, subagents: int = 8, compactions: int = 2,
                        rollout_id: str = "bench-tree") -> Any:
    """The folded snapshot of the tree described in the module docstring."""
    from processors.fold import fold
    from processors.replay import MemoryState
    from schemas.ids import response_id
    from schemas.records import RolloutEvent, RolloutFinished

    if n_calls < min_calls(subagents, compactions):
        raise ValueError(f"n_calls={n_calls}: a tree of {subagents} sub-agents and {compactions} compactions "
                         f"needs at least {min_calls(subagents, compactions)} calls")
    builder = _Builder(rollout_id, n_calls, n_tokens)
    sub_calls = max(1, (n_calls * 2 // 5) // subagents) if subagents else 0
    main_calls = n_calls - sub_calls * subagents
    segments = compactions + 1
    sizes = [main_calls // segments + (1 if s < main_calls % segments else 0) for s in range(segments)]
    # Sub-agents are started by evenly spread main calls that are not summaries (each segment's last call).
    spawners = [i for s, size in enumerate(sizes) for i in range(sum(sizes[:s]), sum(sizes[:s]) + size - 1)]
    spawn_at = {spawners[(k * len(spawners)) // subagents]: k for k in range(subagents)} if subagents else {}
    index, summary = 0, None
    for s, size in enumerate(sizes):
        parent = None
        for j in range(size):
            is_summary = s < segments - 1 and j == size - 1
            carried: Sequence[int] = summary if j == 0 and summary is not None else []
            agent = spawn_at.get(index)
            items = _agent_items(agent) if agent is not None else _TOOL_ITEMS
            parent = builder.call(parent, items, carried=carried, summary=is_summary,
                                  last=index == main_calls - 1)
            if is_summary:
                summary = parent.generation_token_ids
            if agent is not None:
                sub_parent = None
                for _ in range(sub_calls):
                    digests = [] if sub_parent else [_agent_digest(agent)]
                    sub_parent = builder.call(sub_parent, _TOOL_ITEMS, digests=digests)
            index += 1
    if builder.spent != n_tokens:
        raise ValueError(f"n_tokens={n_tokens}: too few for {n_calls} calls of this shape "
                         f"(the summaries alone need {SUMMARY_MIN_TOKENS} tokens each); pass more tokens")
    state = MemoryState()
    for event in builder.events:
        state.apply(fold(state, event))
    done = RolloutEvent(event_id="fin", rollout_id=rollout_id, emitted_at=len(builder.events), source="bench",
                        body=RolloutFinished(result_json='{"reward": 1.0}',
                                             final_response_id=response_id("resp_", builder.terminal_id)))
    return fold(state, done).snapshots[-1]


def unique_tokens(snapshot: Any) -> int:
    """Tokens the rollout holds once each: a root's whole prompt, a linked call's delta, every generation."""
    from schemas.records import ParentResolution

    seen: set[str] = set()
    total = 0
    for sc in snapshot.calls:
        call = sc.call
        if call.model_call_id in seen:
            continue
        seen.add(call.model_call_id)
        if call.prompt_is_delta and call.parent_resolution is not ParentResolution.RESOLVED:
            raise ValueError(f"call {call.model_call_id}: a delta prompt whose parent is "
                             f"{call.parent_resolution.value}; its new tokens cannot be told apart")
        total += len(call.prompt_token_ids) + len(call.generation_token_ids)
    return total


_TOOL_ITEMS: list[dict[str, Any]] = [
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
    {"type": "function_call", "call_id": "t", "name": "tool", "arguments": "{}"}]


def _agent_prompt(k: int) -> str:
    return f"Sub-task {k}: read the files of area {k} and report what calls what."


def _agent_digest(k: int) -> str:
    from schemas.hashing import text_digest

    return text_digest(_agent_prompt(k))


def _agent_items(k: int) -> list[dict]:
    arguments = json.dumps({"description": f"area {k}", "prompt": _agent_prompt(k), "subagent_type": f"explorer-{k}"})
    return [*_TOOL_ITEMS[:1], {"type": "function_call", "call_id": f"agent-{k}", "name": "Agent",
                               "arguments": arguments}]


class _Builder:
    """Emits the calls in creation order, each call spending its share of the token budget."""

    def __init__(self, rollout_id: str, n_calls: int, n_tokens: int) -> None:
        self.rollout_id, self.n_tokens, self.terminal_id = rollout_id, n_tokens, ""
        self.events: list[Any] = []
        self.per_call = max(2, n_tokens // n_calls)
        self.gen = max(1, self.per_call * 3 // 10)
        self.spent = 0
        self.cumulative: dict[str, list[int]] = {}
        self.rng = random.Random(20_240_512)

    def tokens(self, n: int) -> list[int]:
        return [self.rng.randrange(VOCAB) for _ in range(max(0, n))]

    def call(self, parent: Any, items: list[dict], *, carried: Sequence[int] = (), summary: bool = False,
             last: bool = False, digests: Sequence[str] = ()) -> Any:
        from schemas.hashing import compute_digest
        from schemas.records import CallCaptured, CallFacts, ParentResolution, RolloutEvent

        gen = max(SUMMARY_MIN_TOKENS, self.gen) if summary else self.gen
        fresh = max(0, self.per_call - gen - len(carried))
        new_prompt = self.tokens(fresh // 2) + list(carried) + self.tokens(fresh - fresh // 2)
        if last:  # land exactly on n_tokens
            new_prompt += self.tokens(self.n_tokens - self.spent - len(new_prompt) - gen)
        prior = self.cumulative.pop(parent.model_call_id) if parent is not None else []
        generation = self.tokens(gen)
        full = prior + new_prompt + generation
        i = len(self.events)
        call = CallCaptured(
            model_call_id=f"{i:032x}", created_at=1_700_000_000.0 + i, prompt_token_ids=new_prompt,
            prompt_is_delta=parent is not None, generation_token_ids=generation,
            generation_log_probs=[-0.001 * ((k % 97) + 1) for k in range(gen)],
            output_items_json=json.dumps(items, separators=(",", ":")), token_item_index=0,
            parent_call_id=parent.model_call_id if parent is not None else None,
            parent_resolution=ParentResolution.RESOLVED if parent is not None else ParentResolution.ROOT,
            parent_digest=parent.digest if parent is not None else "", cum_len=len(full), digest=compute_digest(full),
            facts=CallFacts(route="/v1/chat/completions", requested_model="policy", tools_present=True,
                            opening_text_digests=list(digests)),
        )
        self.spent += len(new_prompt) + gen
        self.cumulative[call.model_call_id] = full
        if last:
            self.terminal_id = call.model_call_id
        self.events.append(RolloutEvent(event_id=f"e{i}", rollout_id=self.rollout_id, emitted_at=i,
                                        source="bench", body=call))
        return call
