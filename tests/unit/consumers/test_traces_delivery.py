"""``delivery_mode="traces"`` (issue 12): what the traces hold and how they travel.

Forks in compact tree form, retries, side calls, a chain error confined to its trace, the other
delivery modes left alone, the codec and JSON forms, record validity per trace, and the new rules.
Identity scenarios are in ``test_traces``.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from consumers.rebuild import rebuild
from consumers.rebuild.output import to_json_dict, to_json_line
from consumers.rebuild.rules import RebuildRules
from consumers.rebuild.tree import expand_trace
from consumers.rebuild.validity import checked_record, strict_loads
from schemas.codec import decode_rebuilt, encode_rebuilt
from schemas.errors import ConfigError
from schemas.hashing import compute_digest
from schemas.records import MaskCode, TraceAttachment
from tests.factories import finished
from tests.unit.consumers.support import child, codes, declared, detail, root, snapshot_of, tokens, unresolved
from tests.unit.consumers.test_traces import (
    SUMMARY,
    gen,
    ids,
    owner,
    subagent_conversation,
    tcodes,
    trace_of,
    traces,
)
from tests.unit.consumers.trace_forests import agent_items, middle, opening

# -- forks --------------------------------------------------------------------------------------


def test_a_fork_in_the_main_tree_is_an_other_trace_sharing_mains_prefix():
    m1 = root([1, 2, 3], [4, 5])
    m2 = child(m1, [6], [7])
    m3 = child(m2, [8], [9])
    f1 = child(m1, [20, 21], [22, 23])
    f2 = child(f1, [24], [25])
    out = traces(snapshot_of(m1, m2, m3, f1, f2, finish=declared(m3)))
    assert not out.mask_sample, out.mask_reasons
    main_index, fork_index = owner(out, m1), owner(out, f1)
    fork = out.traces[fork_index]
    assert (fork.kind, fork.label, fork.classified_by, fork.call_ids) == ("other", "main/fork", "fork", ids(f1, f2))
    assert (fork.prefix_trace, fork.prefix_len, fork.parent_trace) == (main_index, m1.cum_len, main_index)
    assert fork.attachment == TraceAttachment(call_id=m1.model_call_id)
    assert fork.trajectory.token_ids == tokens(f2)[m1.cum_len:]  # only its own tokens are stored
    whole = expand_trace(out, fork_index)
    assert whole.token_ids == tokens(f2) and compute_digest(whole.token_ids) == f2.digest
    assert whole.loss_mask[:m1.cum_len] == bytes(m1.cum_len)  # the shared prefix is context here
    assert whole.loss_mask.count(1) == gen(f1, f2) == fork.loss_tokens
    assert [sp.model_call_id for sp in whole.spans] == ids(m1, f1, f2)


# -- retries --------------------------------------------------------------------------------------


def test_unresolved_retry_siblings_mark_the_survivors_subagent_trace_only():
    m1 = root([1, 2], [3], output_items_json=agent_items("toolu_1", "dig", subagent_type="Explore"))
    m2 = child(m1, [4], [5])
    s1 = root([50], [51], facts=opening("dig"))
    r1, r2 = child(s1, [60], [61]), child(s1, [60], [62])  # same parent, same new prompt, neither continued
    out = traces(snapshot_of(m1, m2, s1, r1, r2, finish=declared(m2)))
    survivor, lost = sorted((r1, r2), key=lambda c: c.model_call_id)
    sub = trace_of(out, s1)
    assert sub.call_ids == ids(s1, survivor)
    assert tcodes(sub) == [MaskCode.UNRESOLVED_RETRY] and sub.mask_reasons[0].call_ids == sorted(ids(r1, r2))
    assert not any(lost.model_call_id in t.call_ids for t in out.traces)
    assert not out.mask_sample


def test_an_unresolved_retry_on_main_masks_the_rollout():
    m1 = root([1, 2], [3])
    a, b = child(m1, [4], [5]), child(m1, [4], [6])
    out = traces(snapshot_of(m1, a, b, finish=finished()))  # nothing declared: the heuristic picks the survivor
    main = out.traces[0]
    assert main.kind == "main" and MaskCode.UNRESOLVED_RETRY in tcodes(main)
    assert MaskCode.TRACE_MASKED in codes(out)


def test_a_retry_whose_sibling_was_continued_is_quarantined_and_in_no_trace():
    m1 = root([1, 2], [3], output_items_json=agent_items("toolu_1", "dig", subagent_type="Explore"))
    m2 = child(m1, [4], [5])
    s1 = root([50], [51], facts=opening("dig"))
    kept, dropped = child(s1, [60], [61]), child(s1, [60], [62])
    after = child(kept, [63], [64])
    out = traces(snapshot_of(m1, m2, s1, kept, dropped, after, finish=declared(m2)))
    assert detail(out)["quarantined_call_ids"] == ids(dropped) and detail(out)["unresolved_retries"] == []
    assert not any(dropped.model_call_id in t.call_ids for t in out.traces)
    assert trace_of(out, s1).call_ids == ids(s1, kept, after) and not trace_of(out, s1).mask_sample
    assert sum(t.loss_tokens for t in out.traces) == gen(m1, m2, s1, kept, after)


# -- side calls -----------------------------------------------------------------------------------


def test_side_calls_become_a_side_trace_without_tokens():
    m1 = root([1, 2], [3])
    m2 = child(m1, [4], [5])
    h1 = root([900], [901, 902], requested_model="claude-haiku-4")
    h2 = child(h1, [903], [904], requested_model="claude-haiku-4")
    out = traces(snapshot_of(m1, h1, m2, h2, finish=declared(m2)), side_call_models=("haiku",))
    assert not out.mask_sample, out.mask_reasons
    side = trace_of(out, h1)
    assert (side.kind, side.label, side.classified_by, side.call_ids) == ("side", "pattern", "side_rule", ids(h1, h2))
    assert (side.trajectory, side.loss_tokens, side.response_json) == (None, 0, None)
    assert sum(t.loss_tokens for t in out.traces) == gen(m1, m2)


# -- a chain error stays in its trace ----------------------------------------------------------


def test_a_nan_log_prob_in_a_subagent_masks_only_that_trace():
    m1, s1, _, m2 = subagent_conversation(subagent_type="Explore")
    s2 = child(s1, [70], [71, 72], log_probs=[-0.1, math.nan])
    out = traces(snapshot_of(m1, s1, s2, m2, finish=declared(m2)))
    sub, main = trace_of(out, s1), trace_of(out, m1)
    assert tcodes(sub) == [MaskCode.NON_FINITE_LOG_PROB] and sub.trajectory is None and sub.loss_tokens == 0
    assert not main.mask_sample and main.loss_tokens == gen(m1, m2)
    assert not out.mask_sample and out.trajectory is not None
    assert out.metrics.generated_tokens_delivered == gen(m1, m2)
    strict_loads(to_json_line(out).decode())


# -- the other delivery modes -----------------------------------------------------------------


def rich_snapshot():
    """main with a sub-agent and a fork, compacted into an UNRESOLVED segment that ends in the answer."""
    m1, s1, s2, m2 = subagent_conversation(subagent_type="Explore")
    fork = child(m1, [85], [95, 96])
    s = child(m2, [99], SUMMARY)
    c1 = unresolved([7, 8, *middle(SUMMARY), 9], [300, 301])
    c2 = child(c1, [400], [401, 402])
    h1 = root([900], [901], requested_model="claude-haiku-4")
    x = root([950], [951])
    calls = dict(m1=m1, s1=s1, s2=s2, m2=m2, fork=fork, s=s, c1=c1, c2=c2, h1=h1, x=x)
    return snapshot_of(*calls.values(), finish=declared(c2)), calls


RICH_RULES = dict(side_call_models=("haiku",))
_TOTALS = ("generated_tokens_delivered", "delivered_fraction")


def test_terminal_mode_delivers_what_traces_mode_does_at_the_top_level_and_no_traces():
    snap, calls = rich_snapshot()
    terminal = rebuild(snap, RebuildRules(**RICH_RULES))
    full = traces(snap, **RICH_RULES)
    assert terminal.traces == [] and len(full.traces) == 6
    for name in ("rollout_id", "snapshot_id", "version", "trajectory", "result_json"):
        assert getattr(terminal, name) == getattr(full, name), name
    # traces mode projects each trace, not the terminal chain again (it is a trunk's projection)
    assert terminal.response_json is not None and full.response_json is None
    assert all(t.response_json is not None for t in full.traces if t.trajectory is not None)
    assert dataclasses.replace(terminal.metrics, **{k: 0 for k in _TOTALS}) == \
        dataclasses.replace(full.metrics, **{k: 0 for k in _TOTALS})
    # the masks differ by design: terminal mode reads the chain's lineage, traces mode the traces
    assert codes(terminal) == [MaskCode.UNRESOLVED_PARENT]
    assert MaskCode.UNRESOLVED_PARENT not in codes(full)
    assert terminal.metrics.generated_tokens_delivered == gen(calls["c1"], calls["c2"])
    assert full.metrics.generated_tokens_delivered == sum(t.loss_tokens for t in full.traces if not t.mask_sample)


@pytest.mark.parametrize("mode", ["terminal", "gym"])
def test_trace_rules_change_nothing_in_the_other_modes(mode):
    snap, _ = rich_snapshot()
    plain = rebuild(snap, RebuildRules(delivery_mode=mode, **RICH_RULES))
    tuned = rebuild(snap, RebuildRules(delivery_mode=mode, subagent_tools=("Nothing",), compaction_min_tokens=3,
                                       train_summaries=False, mask_rollout_kinds=("main", "subagent", "other"),
                                       **RICH_RULES))
    assert plain.traces == [] and encode_rebuilt(plain) == encode_rebuilt(tuned)
    assert "traces" not in to_json_dict(plain)


# -- codec and JSON -----------------------------------------------------------------------------


def test_a_traces_record_round_trips_through_the_codec():
    snap, _ = rich_snapshot()
    out = traces(snap, **RICH_RULES)
    kinds = sorted(t.kind for t in out.traces)
    assert kinds == ["compaction", "main", "other", "other", "side", "subagent"]
    assert decode_rebuilt(encode_rebuilt(out)) == out


def test_json_line_and_dict_agree_and_carry_each_traces_response_and_counts():
    snap, _ = rich_snapshot()
    out = traces(snap, **RICH_RULES)
    line, whole = json.loads(to_json_line(out)), to_json_dict(out)
    assert line == whole
    assert len(line["traces"]) == len(out.traces)
    for index, (rendered, trace) in enumerate(zip(line["traces"], out.traces)):
        assert (rendered["kind"], rendered["label"], rendered["call_ids"]) == (trace.kind, trace.label, trace.call_ids)
        assert rendered["response"] == (json.loads(trace.response_json) if trace.response_json else None)
        counts = rendered["_ng_token_capture"]
        context = len(expand_trace(out, index).token_ids) - trace.loss_tokens if trace.trajectory else 0
        assert counts == {"calls": len(trace.call_ids), "loss_tokens": trace.loss_tokens, "context_tokens": context}
    main = line["traces"][0]
    assert main["kind"] == "main" and main["response"] is not None and main["trajectory"]["token_ids"]
    assert [t["response"] is None for t in line["traces"]].count(False) == 5  # every trace with tokens


def test_a_trace_with_a_nan_log_prob_comes_out_masked_with_its_trajectory_withheld():
    snap, calls = rich_snapshot()
    out = traces(snap, **RICH_RULES)
    index = owner(out, calls["s1"])
    sub = out.traces[index]
    broken = dataclasses.replace(sub, trajectory=dataclasses.replace(
        sub.trajectory, log_probs=[math.nan, *sub.trajectory.log_probs[1:]]))
    record = dataclasses.replace(out, traces=[broken if i == index else t for i, t in enumerate(out.traces)])
    checked = checked_record(record)
    fixed = checked.traces[index]
    assert fixed.mask_sample and fixed.trajectory is None and fixed.response_json is None
    assert tcodes(fixed)[-1] == MaskCode.NON_FINITE_LOG_PROB
    assert checked.mask_sample and codes(checked)[-1] == MaskCode.NON_FINITE_LOG_PROB
    others = [i for i in range(len(out.traces)) if i != index]
    assert [checked.traces[i] for i in others] == [out.traces[i] for i in others]
    rendered = strict_loads(to_json_line(record).decode())  # does not raise, and is strict JSON
    assert rendered["traces"][index]["trajectory"] is None and rendered["mask_sample"] is True


# -- rules ----------------------------------------------------------------------------------------


def test_an_unknown_mask_rollout_kind_is_refused_by_name():
    with pytest.raises(ConfigError, match="mask_rollout_kinds") as error:
        RebuildRules(delivery_mode="traces", mask_rollout_kinds=["bogus"])
    assert "bogus" in str(error.value) and "subagent" in str(error.value)


@pytest.mark.parametrize("field, value", [("compaction_min_tokens", 0), ("subagent_tools", ("",))])
def test_other_trace_rules_are_validated_by_name(field, value):
    with pytest.raises(ConfigError, match=field):
        RebuildRules(delivery_mode="traces", **{field: value})


def test_trace_rules_round_trip_through_a_mapping():
    rules = RebuildRules(delivery_mode="traces", subagent_tools=("Agent", "Delegate"), compaction_min_tokens=8,
                         train_summaries=False, mask_rollout_kinds=("subagent", "main"))
    mapping = rules.to_mapping()
    assert mapping["subagent_tools"] == ["Agent", "Delegate"]
    assert mapping["mask_rollout_kinds"] == ["main", "subagent"]  # kept in TraceKind order
    assert RebuildRules.from_mapping(json.loads(json.dumps(mapping))) == rules
    with pytest.raises(ConfigError, match="mask_rollout_kinds"):
        RebuildRules.from_mapping({"mask_rollout_kinds": "main"})


def test_a_retried_summary_that_the_next_segment_carries_survives_retry_resolution():
    # Two same-prompt summary attempts, neither continued by a child: without the carried-summary pin the
    # smaller call id (the one nothing carries) survives, and the segment that follows links to nothing.
    m1 = root([1, 2], [3], created_at=1.0)
    carried = child(m1, [6], list(range(200, 220)), call_id="b" * 32, created_at=2.0)
    dropped = child(m1, [6], list(range(300, 320)), call_id="a" * 32, created_at=3.0)
    c1 = root([7, *range(200, 220), 8], [9], created_at=4.0)
    c2 = child(c1, [10], [11], created_at=5.0)
    out = rebuild(snapshot_of(m1, carried, dropped, c1, c2, finish=declared(c2)),
                  RebuildRules(delivery_mode="traces"))
    assert not out.mask_sample, out.mask_reasons
    kinds = [(t.kind, t.segment, t.call_ids) for t in out.traces]
    assert kinds == [("main", 0, [m1.model_call_id, carried.model_call_id]),
                     ("compaction", 1, [c1.model_call_id, c2.model_call_id])]
    assert out.traces[1].attachment.call_id == carried.model_call_id
    assert dropped.model_call_id in detail(out)["quarantined_call_ids"]


def test_a_subagents_answer_carried_beside_the_summary_does_not_make_the_compaction_ambiguous():
    # The parent's post-compaction prompt keeps the sub-agent's answer (a tool result) and the summary.
    answer = list(range(500, 520))
    m1 = root([1, 2, 3], [10, 11], output_items_json=agent_items("toolu_1", "Explore the repo"), created_at=1.0)
    s1 = root([50, 51], answer, facts=opening("Explore the repo"), created_at=2.0)
    m2 = child(m1, [80, *answer, 81], [90, 91], created_at=3.0)
    summary = child(m2, [99], list(range(200, 240)), created_at=4.0)
    c1 = root([7, *answer, *range(200, 240), 8], [300, 301], created_at=5.0)
    out = rebuild(snapshot_of(m1, s1, m2, summary, c1, finish=declared(c1)), RebuildRules(delivery_mode="traces"))
    assert not out.mask_sample, out.mask_reasons
    segment = next(t for t in out.traces if t.kind == "compaction")
    assert (segment.segment, segment.attachment.call_id, segment.mask_sample) == (1, summary.model_call_id, False)
    assert [t.kind for t in out.traces].count("subagent") == 1


def test_a_summary_whose_thinking_the_harness_dropped_still_links():
    # The next prompt carries only the last part of the summary's generation (Claude Code keeps the text,
    # not the thinking before it): a window off the middle is carried.
    m1 = root([1, 2], [3], created_at=1.0)
    generation = list(range(200, 280))  # 80 tokens: "thinking" 200-259, text 260-279
    s = child(m1, [6], generation, created_at=2.0)
    c1 = root([7, *generation[60:], 8], [9], created_at=3.0)
    c2 = child(c1, [10], [11], created_at=4.0)
    out = traces(snapshot_of(m1, s, c1, c2, finish=declared(c2)))
    seg = trace_of(out, c1)
    assert (seg.kind, seg.segment, seg.attachment.call_id) == ("compaction", 1, s.model_call_id)
