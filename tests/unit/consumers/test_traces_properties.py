"""Properties of ``delivery_mode="traces"`` over random forests (hypothesis), whatever the event order.

Forests come from ``trace_forests``: a main conversation with sub-agents (nested), retries,
compactions, forks and side calls, interleaved in creation order. Each forest is folded in
creation order, in a random causal order, as verified deltas in any order, and as its snapshot
with the calls listed in another order. Properties:

(a) the traces' loss-bearing tokens are the generated tokens of the policy calls that were not
    quarantined (abandoned retries) and are not side calls (nor untrained summaries);
(b) no (call, token) is loss-bearing in two traces;
(c) every trace with a trajectory expands to contiguous tokens that hash to its last call's digest;
(d) the record is byte-identical across event orders;
(e) every generated sub-agent root is a ``subagent`` trace hanging off the trace of its Agent call,
    every compaction root a ``compaction`` trace of the right segment hanging off its summary.
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consumers.rebuild import rebuild
from consumers.rebuild.rules import RebuildRules
from consumers.rebuild.trajectory import assert_spans_contiguous
from consumers.rebuild.tree import expand_trace
from schemas.codec import encode_rebuilt
from schemas.hashing import compute_digest
from schemas.records import MaskCode, RebuiltRollout, TraceAttachment
from tests.unit.consumers.support import reordered
from tests.unit.consumers.trace_forests import TraceForest, trace_forests

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                          HealthCheck.data_too_large])


def rules_for(train_summaries: bool) -> RebuildRules:
    return RebuildRules(delivery_mode="traces", side_call_models=("haiku",), train_summaries=train_summaries)


def owner(rollout: RebuiltRollout, call_id: str) -> int:
    found = [i for i, t in enumerate(rollout.traces) if call_id in t.call_ids]
    assert len(found) == 1, f"call {call_id} is owned by traces {found}"
    return found[0]


def loss_bearing(rollout: RebuiltRollout) -> list[tuple[str, int]]:
    """Every (call id, index in its generation) some trace trains on, once per trace that does."""
    out = []
    for trace in rollout.traces:
        if trace.trajectory is None:
            continue
        traj = trace.trajectory
        for span in traj.spans:
            for position in range(span.generation_start, span.end):
                if traj.loss_mask[position - trace.prefix_len]:
                    out.append((span.model_call_id, position - span.generation_start))
    return out


def check(forest: TraceForest, out: RebuiltRollout, train_summaries: bool) -> None:
    by_id = {c.model_call_id: c for c in forest.calls}
    detail = json.loads(out.metrics.detail_json)
    quarantined = set(detail["quarantined_call_ids"])
    assert {s["call_id"] for s in detail["side_calls"]} == forest.side_ids
    summaries = set() if train_summaries else {c.summary.model_call_id for c in forest.compactions}
    trained = [c for c in forest.calls
               if c.model_call_id not in quarantined | forest.side_ids | summaries]

    # (a) and (b)
    pairs = loss_bearing(out)
    assert len(pairs) == len(set(pairs)), "a token is loss-bearing in two traces"
    assert set(pairs) == {(c.model_call_id, j) for c in trained for j in range(len(c.generation_token_ids))}
    assert sum(t.loss_tokens for t in out.traces) == sum(len(c.generation_token_ids) for c in trained)
    assert not any(cid in quarantined for t in out.traces for cid in t.call_ids)

    # (c)
    for index, trace in enumerate(out.traces):
        if trace.kind == "side":
            assert trace.trajectory is None and trace.loss_tokens == 0
            assert set(trace.call_ids) <= forest.side_ids
            continue
        assert trace.trajectory is not None, (index, trace.mask_reasons)
        whole = expand_trace(out, index)
        assert compute_digest(whole.token_ids) == by_id[trace.call_ids[-1]].digest
        assert_spans_contiguous(whole.spans, len(whole.token_ids))
        assert [s.model_call_id for s in whole.spans][-len(trace.call_ids):] == trace.call_ids
        assert whole.loss_mask[:trace.prefix_len] == bytes(trace.prefix_len)
        assert whole.loss_mask.count(1) == trace.loss_tokens == len(whole.log_probs)

    # (e)
    main = out.traces[owner(out, forest.main_root.model_call_id)]
    assert (main.kind, main.label, main.segment) == ("main", "main", 0)
    for sub in forest.subagents:
        trace = out.traces[owner(out, sub.root.model_call_id)]
        assert (trace.kind, trace.label, trace.classified_by) == ("subagent", sub.label, "agent_tool")
        assert trace.parent_trace == owner(out, sub.agent_call.model_call_id)
        assert trace.attachment == TraceAttachment(call_id=sub.agent_call.model_call_id, tool_call_id=sub.tool_call_id)
    for seg in forest.compactions:
        trace = out.traces[owner(out, seg.root.model_call_id)]
        assert (trace.kind, trace.label, trace.segment, trace.classified_by) == ("compaction", seg.label,
                                                                                  seg.segment, "summary")
        assert trace.parent_trace == owner(out, seg.summary.model_call_id)
        assert trace.attachment == TraceAttachment(call_id=seg.summary.model_call_id)
    for trace in out.traces:
        if trace.prefix_trace != -1:  # a fork: it shares the trace that owns the call it forks at
            fork = by_id[trace.attachment.call_id]
            assert (trace.kind, trace.classified_by, trace.label.endswith("/fork")) == ("other", "fork", True)
            assert trace.parent_trace == trace.prefix_trace == owner(out, fork.model_call_id)
            assert trace.prefix_len == fork.cum_len
    # nothing in these forests is unexplained: the only reason a trace may carry is an unresolved retry
    for trace in out.traces:
        assert {r.code for r in trace.mask_reasons} <= {MaskCode.UNRESOLVED_RETRY}, trace.mask_reasons
    masking = [t for t in out.traces if t.mask_sample and t.kind in ("main", "compaction")]
    assert [r.code for r in out.mask_reasons] == [MaskCode.TRACE_MASKED] * len(masking)


@SETTINGS
@given(forest=trace_forests(), data=st.data(), train_summaries=st.booleans())
def test_traces_cover_the_forest_once_token_exact_and_independent_of_event_order(forest, data, train_summaries):
    rules = rules_for(train_summaries)
    n = len(forest.calls)
    snapshot = forest.snapshot()
    out = rebuild(snapshot, rules)
    check(forest, out, train_summaries)

    # (d)
    expected = encode_rebuilt(out)
    causal = forest.causal_order(data.draw(st.permutations(range(n)), label="causal priority"))
    deltas = forest.as_deltas(data.draw(st.permutations(range(n)), label="delta order"))
    listed = data.draw(st.permutations(range(len(snapshot.calls))), label="snapshot order")
    for label, other in (("causal", forest.snapshot(causal)), ("deltas", forest.snapshot(deltas)),
                         ("listed", reordered(snapshot, listed))):
        assert encode_rebuilt(rebuild(other, rules)) == expected, label
