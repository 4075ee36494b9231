"""Recorded rollouts for the TRL / OpenEnv converter tests, and what TRL must build from each.

Each scenario is a real rebuild (``consumers.rebuild.rebuild``) of calls folded by the processor's
own fold (``tests.unit.consumers.support``); ``expected_sequences`` says, from the captured calls
themselves (not from the converter), which rows TRL's ``_chain_to_sequences`` must build: each
loss-bearing trace expanded (ids, loss mask), the captured log-prob at every generated position
of the trace's own calls (trained or not), 0.0 on context; consecutive traces that continue each
other merge (TRL appends a prompt that extends what it holds), rows without a trained token are
dropped (as TRL drops them).
"""

from __future__ import annotations

import dataclasses
import json
import math

from consumers.rebuild import rebuild
from consumers.rebuild.rules import RebuildRules
from consumers.rebuild.tree import expand_trace
from schemas.records import CallCaptured, RebuiltRollout, VersionSpan
from tests.factories import finished
from tests.unit.consumers.support import child, declared, root, snapshot_of
from tests.unit.consumers.test_traces import compacted_conversation, subagent_conversation
from tests.unit.consumers.test_traces_delivery import RICH_RULES, rich_snapshot

__all__ = ["SCENARIOS", "Scenario", "expected_sequences"]


@dataclasses.dataclass(frozen=True)
class Scenario:
    record: RebuiltRollout
    calls: dict[str, CallCaptured]  # by model call id
    scorable: bool


def _tool_items(call_id: str, name: str, arguments: dict) -> str:
    return json.dumps([{"type": "function_call", "call_id": call_id, "name": name,
                        "arguments": json.dumps(arguments)}])


def tool_calls() -> Scenario:
    """Terminal mode: two tool calls (get_weather, then Bash), tool results spliced in as prompt, an answer;
    versions v1 then v2 across the second call (an update mid-generation, observed)."""
    m1 = root([1, 2, 3, 4], [10, 11, 12], output_items_json=_tool_items("call_1", "get_weather", {"city": "Oslo"}),
              facts={"policy_version": "v1", "dispatch_version": "v1"})
    m2 = child(m1, [20, 21, 22], [30, 31, 32, 33], output_items_json=_tool_items("call_2", "Bash", {"command": "ls"}),
               facts={"version_spans": [VersionSpan(version="v1", start=0, end=2),
                                        VersionSpan(version="v2", start=2, end=4)],
                      "version_spans_source": "observed", "dispatch_version": "v1"})
    m3 = child(m2, [40, 41], [50, 51], facts={"policy_version": "v2", "dispatch_version": "v2"})
    record = rebuild(snapshot_of(m1, m2, m3, finish=declared(m3, result={"reward": 0.75})), RebuildRules())
    return Scenario(record, _by_id(m1, m2, m3), scorable=True)


def rich() -> Scenario:
    """Traces mode: main (an Agent call) with a sub-agent and a fork, compacted into a segment that answers,
    a side call and a root nothing explains (its trace masked, the rollout not)."""
    snap, calls = rich_snapshot()
    record = rebuild(snap, RebuildRules(delivery_mode="traces", **RICH_RULES))
    return Scenario(record, _by_id(*calls.values()), scorable=True)


def untrained_summary(project_response: bool = True) -> Scenario:
    """Traces mode, ``train_summaries=False``: the summary is context, its log-probs only in the projection."""
    calls = compacted_conversation()
    record = rebuild(snapshot_of(*calls, finish=declared(calls[-1])),
                     RebuildRules(delivery_mode="traces", train_summaries=False, project_response=project_response))
    return Scenario(record, _by_id(*calls), scorable=True)


def masked_subagent() -> Scenario:
    """A NaN log-prob in a sub-agent masks that trace only: the rollout trains on main without it."""
    m1, s1, _, m2 = subagent_conversation(subagent_type="Explore")
    s2 = child(s1, [70], [71, 72], log_probs=[-0.1, math.nan])
    record = rebuild(snapshot_of(m1, s1, s2, m2, finish=declared(m2)), RebuildRules(delivery_mode="traces"))
    return Scenario(record, _by_id(m1, s1, s2, m2), scorable=True)


def masked_rollout() -> Scenario:
    """An unresolved retry on main masks the rollout: nothing may be trained, the reward is withheld."""
    m1 = root([1, 2], [3])
    a, b = child(m1, [4], [5]), child(m1, [4], [6])
    record = rebuild(snapshot_of(m1, a, b, finish=finished()), RebuildRules(delivery_mode="traces"))
    return Scenario(record, _by_id(m1, a, b), scorable=False)


SCENARIOS = {"tool_calls": tool_calls, "rich": rich, "untrained_summary": untrained_summary,
             "masked_subagent": masked_subagent, "masked_rollout": masked_rollout}


def expected_sequences(scenario: Scenario) -> list[dict]:
    """The rows TRL must build (see the module docstring): ``[{input_ids, completion_mask, old_log_probs}]``."""
    record = scenario.record
    if not scenario.scorable:
        return []
    wholes = []
    if record.traces:
        for index, trace in enumerate(record.traces):
            if trace.kind == "side" or trace.mask_sample or trace.trajectory is None:
                continue
            wholes.append((expand_trace(record, index), set(trace.call_ids)))
    else:
        assert record.trajectory is not None
        wholes.append((record.trajectory, {s.model_call_id for s in record.trajectory.spans}))
    rows: list[dict] = []
    for whole, own in wholes:
        logps = [0.0] * len(whole.token_ids)
        for span in whole.spans:
            if span.model_call_id in own:
                logps[span.generation_start:span.end] = scenario.calls[span.model_call_id].generation_log_probs
        row = {"input_ids": list(whole.token_ids), "completion_mask": list(whole.loss_mask), "old_log_probs": logps}
        held = rows[-1]["input_ids"] if rows else None
        if held is not None and row["input_ids"][:len(held)] == held:  # TRL appends a prompt extending its row
            cut = len(held)
            for key in row:
                rows[-1][key] = rows[-1][key] + row[key][cut:]
        else:
            rows.append(row)
    return [r for r in rows if 1 in r["completion_mask"]]


def _by_id(*calls: CallCaptured) -> dict[str, CallCaptured]:
    return {c.model_call_id: c for c in calls}
