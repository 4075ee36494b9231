"""``delivery_mode="traces"`` (issue 12): every trace of a rollout's forest, labelled and delivered token-exact.

Who each trace is: sub-agents (Agent/Task calls, nested, ambiguous), compaction segments (linked
by the carried summary, chained, too short, ambiguous, untrained summaries), roots nothing
explains, declarations and agent headers. ``test_traces_delivery`` covers forks, retries, side
calls, chain errors, the other modes, the wire forms and the rules; ``test_traces_properties``
the guarantees over random forests.
"""

from __future__ import annotations

import pytest

from consumers.rebuild import rebuild
from consumers.rebuild.rules import RebuildRules
from consumers.rebuild.tree import children
from schemas.records import MaskCode, RebuiltRollout, Trace, TraceAttachment
from tests.unit.consumers.support import child, codes, declared, detail, root, snapshot_of, unresolved
from tests.unit.consumers.trace_forests import agent_items, middle, opening

# -- helpers ----------------------------------------------------------------------------------


def traces(snapshot, **rules) -> RebuiltRollout:
    return rebuild(snapshot, RebuildRules(delivery_mode="traces", **rules))


def owner(rollout: RebuiltRollout, call) -> int:
    """Index of the one trace whose own calls include ``call``."""
    found = [i for i, t in enumerate(rollout.traces) if call.model_call_id in t.call_ids]
    assert len(found) == 1, f"call {call.model_call_id} is owned by traces {found}"
    return found[0]


def trace_of(rollout: RebuiltRollout, call) -> Trace:
    return rollout.traces[owner(rollout, call)]


def tcodes(trace: Trace) -> list[str]:
    return [r.code for r in trace.mask_reasons]


def ids(*calls) -> list[str]:
    return [c.model_call_id for c in calls]


def gen(*calls) -> int:
    return sum(len(c.generation_token_ids) for c in calls)


SUMMARY = list(range(200, 240))  # a 40-token summary generation


def subagent_conversation(name="Agent", **args):
    """main m1 (launches a sub-agent) -> m2 (the answer); the sub-agent s1 -> s2 opens with the prompt."""
    m1 = root([1, 2, 3], [10, 11], output_items_json=agent_items("toolu_1", "Explore the repo", name=name, **args))
    s1 = root([50, 51], [60, 61, 62], facts=opening("Explore  the\nrepo"))  # whitespace is normalised
    s2 = child(s1, [70], [71, 72])
    m2 = child(m1, [80, 81], [90, 91])
    return m1, s1, s2, m2


def compacted_conversation(root_of=root):
    """main m1 -> m2 -> S (the summary); the next segment c1 carries S's middle tokens -> c2 (the answer)."""
    m1 = root([1, 2], [3])
    m2 = child(m1, [4], [5])
    s = child(m2, [6], SUMMARY)
    c1 = root_of([7, 8, *middle(SUMMARY), 9], [300, 301])
    c2 = child(c1, [400], [401, 402])
    return m1, m2, s, c1, c2


# -- sub-agents -------------------------------------------------------------------------------


@pytest.mark.parametrize("name, args, label", [
    ("Agent", {"subagent_type": "Explore", "description": "look"}, "Explore"),
    ("Task", {"description": "look around"}, "look around"),
    # Codex's multi-agent tool: the opening message is its ``message`` argument.
    ("spawn_agent", {"prompt_arg": "message", "agent_type": "explorer"}, "explorer"),
    ("spawn_agent", {"prompt_arg": "message"}, "spawn_agent"),
])
def test_an_agent_call_whose_prompt_opens_a_root_makes_it_a_subagent_attached_to_that_call(name, args, label):
    m1, s1, s2, m2 = subagent_conversation(name, **args)
    out = traces(snapshot_of(m1, s1, s2, m2, finish=declared(m2)))
    assert not out.mask_sample, out.mask_reasons
    main, sub = trace_of(out, m1), trace_of(out, s1)
    assert (main.kind, main.label, main.classified_by, main.call_ids) == ("main", "main", "terminal", ids(m1, m2))
    assert (sub.kind, sub.label, sub.classified_by) == ("subagent", label, "agent_tool")
    assert sub.attachment == TraceAttachment(call_id=m1.model_call_id, tool_call_id="toolu_1")
    assert sub.parent_trace == owner(out, m1)
    assert sub.call_ids == ids(s1, s2) and sub.loss_tokens == gen(s1, s2) and not sub.mask_sample
    assert children(out)[owner(out, m1)] == [owner(out, s1)]


def test_a_root_whose_opening_matches_no_agent_prompt_is_not_a_subagent():
    m1, _, _, m2 = subagent_conversation()
    s1 = root([50, 51], [60, 61, 62], facts=opening("Explore another repo"))
    out = traces(snapshot_of(m1, s1, m2, finish=declared(m2)))
    sub = trace_of(out, s1)
    assert (sub.kind, sub.attachment, sub.parent_trace) == ("other", None, -1)
    assert tcodes(sub) == [MaskCode.TRACE_UNCLASSIFIED]


def test_a_subagent_launched_by_a_subagent_hangs_off_the_first_subagents_trace():
    m1 = root([1, 2], [3], output_items_json=agent_items("toolu_1", "plan the work", subagent_type="Plan"))
    s1 = root([50], [51], facts=opening("plan the work"))
    s2 = child(s1, [52], [53], output_items_json=agent_items("toolu_2", "read file a", subagent_type="Explore"))
    t1 = root([90], [91, 92], facts=opening("read file a"))
    m2 = child(m1, [4], [5])
    out = traces(snapshot_of(m1, s1, s2, t1, m2, finish=declared(m2)))
    assert not out.mask_sample, out.mask_reasons
    first, nested = trace_of(out, s1), trace_of(out, t1)
    assert (first.label, first.parent_trace) == ("Plan", owner(out, m1))
    assert (nested.kind, nested.label, nested.parent_trace) == ("subagent", "Explore", owner(out, s1))
    assert nested.attachment == TraceAttachment(call_id=s2.model_call_id, tool_call_id="toolu_2")


def ambiguous_subagent():
    m1 = root([1, 2], [3], output_items_json=agent_items("toolu_1", "look", subagent_type="Explore"))
    m2 = child(m1, [4], [5], output_items_json=agent_items("toolu_2", "look", subagent_type="Explore"))
    s1 = root([50], [51, 52], facts=opening("look"))
    m3 = child(m2, [6], [7])
    return snapshot_of(m1, m2, s1, m3, finish=declared(m3)), s1


def test_two_agent_calls_with_the_prompt_of_one_subagent_make_it_ambiguous_and_mask_only_it():
    snap, s1 = ambiguous_subagent()
    out = traces(snap)
    sub = trace_of(out, s1)
    assert sub.kind == "subagent" and sub.label == "Explore"  # both candidates agree on the label
    assert tcodes(sub) == [MaskCode.TRACE_AMBIGUOUS] and sub.mask_sample
    assert sub.attachment is None and sub.parent_trace == -1
    assert not out.mask_sample and out.mask_reasons == []  # subagent is not in the default mask_rollout_kinds
    assert sub.trajectory is not None and sub.loss_tokens == gen(s1)  # masked, still delivered for inspection


def test_mask_rollout_kinds_with_subagent_masks_the_rollout_for_an_ambiguous_subagent():
    snap, s1 = ambiguous_subagent()
    out = traces(snap, mask_rollout_kinds=("main", "compaction", "subagent"))
    assert codes(out) == [MaskCode.TRACE_MASKED]
    assert out.mask_reasons[0].call_ids == trace_of(out, s1).call_ids
    assert "trace_ambiguous" in out.mask_reasons[0].detail


# -- compaction -------------------------------------------------------------------------------


def test_a_root_carrying_the_middle_of_a_summary_is_the_next_compaction_segment():
    m1, m2, s, c1, c2 = compacted_conversation()
    out = traces(snapshot_of(m1, m2, s, c1, c2, finish=declared(c2)))
    assert not out.mask_sample, out.mask_reasons
    main, seg = trace_of(out, m1), trace_of(out, c1)
    assert (main.kind, main.segment, main.call_ids) == ("main", 0, ids(m1, m2, s))  # the trunk ends at the summary
    assert (seg.kind, seg.label, seg.segment, seg.classified_by) == ("compaction", "main", 1, "summary")
    assert seg.attachment == TraceAttachment(call_id=s.model_call_id) and seg.parent_trace == owner(out, m1)
    assert seg.call_ids == ids(c1, c2)
    # the rollout's own trajectory is still the terminal's chain
    assert [sp.model_call_id for sp in out.trajectory.spans] == ids(c1, c2)


def test_two_compactions_are_segments_one_and_two():
    m1 = root([1, 2], [3])
    s1 = child(m1, [4], SUMMARY)
    second = list(range(500, 530))
    c1 = root([7, *middle(SUMMARY), 8], [9])
    s2 = child(c1, [10], second)
    d1 = root([11, *middle(second), 12], [13])
    d2 = child(d1, [14], [15])
    out = traces(snapshot_of(m1, s1, c1, s2, d1, d2, finish=declared(d2)))
    assert not out.mask_sample, out.mask_reasons
    one, two = trace_of(out, c1), trace_of(out, d1)
    assert (one.kind, one.segment, one.label, one.parent_trace) == ("compaction", 1, "main", owner(out, m1))
    assert (two.kind, two.segment, two.label, two.parent_trace) == ("compaction", 2, "main", owner(out, c1))
    assert one.call_ids == ids(c1, s2) and two.attachment == TraceAttachment(call_id=s2.model_call_id)


def short_summary():
    m1 = root([1, 2], [3])
    s = child(m1, [4], list(range(200, 215)))  # 15 tokens: shorter than compaction_min_tokens=16
    c1 = root([7, *s.generation_token_ids, 8], [9])
    c2 = child(c1, [10], [11])
    return snapshot_of(m1, s, c1, c2, finish=declared(c2)), m1, c1


def test_a_generation_shorter_than_compaction_min_tokens_never_links_even_when_carried_whole():
    snap, m1, c1 = short_summary()
    out = traces(snap)
    assert not any(t.kind == "compaction" for t in out.traces)
    assert trace_of(out, c1).kind == "main"  # the terminal's conversation starts there
    assert (trace_of(out, m1).kind, tcodes(trace_of(out, m1))) == ("other", [MaskCode.TRACE_UNCLASSIFIED])
    linked = traces(snap, compaction_min_tokens=15)  # the rule, not the tokens, decided
    assert (trace_of(linked, c1).kind, trace_of(linked, c1).segment) == ("compaction", 1)
    assert trace_of(linked, m1).kind == "main"


def test_a_root_carrying_two_leaves_generations_continues_from_the_later_one():
    # Claude Code's first prompt after /compact carries the summary and, verbatim, the last turn it kept:
    # the summary is the later leaf (a harness summarises right before it restarts).
    m1 = root([1, 2], [3], created_at=1.0)
    m2 = child(m1, [4], [5], created_at=2.0)
    kept, summary = list(range(200, 220)), list(range(300, 320))
    s1, s2 = child(m1, [6], kept, created_at=3.0), child(m1, [7], summary, created_at=4.0)
    x1 = root([8, *middle(kept), *middle(summary)], [9], created_at=5.0)
    x2 = child(x1, [10], [11], created_at=6.0)
    out = traces(snapshot_of(m1, m2, s1, s2, x1, x2, finish=declared(m2)))
    seg = trace_of(out, x1)
    assert (seg.kind, seg.segment, seg.attachment.call_id, seg.mask_sample) == ("compaction", 1, s2.model_call_id, False)
    assert not out.mask_sample, out.mask_reasons


def test_a_root_carrying_two_leaves_made_at_the_same_instant_is_an_ambiguous_compaction():
    m1 = root([1, 2], [3])
    m2 = child(m1, [4], [5])
    a, b = list(range(200, 220)), list(range(300, 320))
    s1, s2 = child(m1, [6], a, created_at=3.0), child(m1, [7], b, created_at=3.0)  # the two cannot be ordered
    x1 = root([8, *middle(a), *middle(b)], [9], created_at=4.0)
    x2 = child(x1, [10], [11], created_at=5.0)
    out = traces(snapshot_of(m1, m2, s1, s2, x1, x2, finish=declared(m2)))
    seg = trace_of(out, x1)
    assert seg.kind == "compaction" and tcodes(seg) == [MaskCode.TRACE_AMBIGUOUS]
    assert seg.attachment is None and seg.parent_trace == -1 and seg.segment == 0
    assert set(ids(s1, s2)) <= set(seg.mask_reasons[0].call_ids)
    assert codes(out) == [MaskCode.TRACE_MASKED]  # compaction masks the rollout by default


def test_train_summaries_off_makes_the_summary_context_in_its_trace_and_counted_nowhere():
    m1, m2, s, c1, c2 = compacted_conversation()
    snap = snapshot_of(m1, m2, s, c1, c2, finish=declared(c2))
    trained, untrained = traces(snap), traces(snap, train_summaries=False)
    for out, bit in ((trained, 1), (untrained, 0)):
        main = trace_of(out, m1)
        span = next(sp for sp in main.trajectory.spans if sp.model_call_id == s.model_call_id)
        assert set(main.trajectory.loss_mask[span.generation_start:span.end]) == {bit}
        assert main.trajectory.token_ids[span.generation_start:span.end] == SUMMARY
    main = trace_of(untrained, m1)
    assert main.loss_tokens == gen(m1, m2)
    assert main.trajectory.log_probs == m1.generation_log_probs + m2.generation_log_probs
    assert trace_of(untrained, c1).loss_tokens == gen(c1, c2)
    assert sum(t.loss_tokens for t in untrained.traces) == gen(m1, m2, c1, c2)
    assert sum(t.loss_tokens for t in trained.traces) == gen(m1, m2, s, c1, c2)
    assert untrained.metrics.generated_tokens_delivered == gen(m1, m2, c1, c2)


# -- roots nothing explains, unresolved parents ---------------------------------------------------


def test_an_unclassified_extra_root_is_other_and_masks_only_itself():
    m1 = root([1, 2], [3])
    m2 = child(m1, [4], [5])
    x = root([500], [501, 502])
    out = traces(snapshot_of(m1, m2, x, finish=declared(m2)))
    other = trace_of(out, x)
    assert (other.kind, other.label, other.classified_by) == ("other", "root", "none")
    assert tcodes(other) == [MaskCode.TRACE_UNCLASSIFIED] and other.mask_sample
    assert not out.mask_sample and not trace_of(out, m1).mask_sample


def test_an_unresolved_root_no_summary_explains_carries_unresolved_parent():
    m1 = root([1, 2], [3])
    m2 = child(m1, [4], [5])
    u = unresolved([600, 601], [602], facts={"tools_present": True, "agent_name": "helper"})
    out = traces(snapshot_of(m1, m2, u, finish=declared(m2)))
    lost = trace_of(out, u)
    assert lost.kind == "subagent" and tcodes(lost) == [MaskCode.UNRESOLVED_PARENT]
    assert u.model_call_id in lost.mask_reasons[0].call_ids
    assert not out.mask_sample  # a sub-agent trace masks only itself


def test_an_unresolved_root_linked_as_compaction_is_not_masked():
    m1, m2, s, c1, c2 = compacted_conversation(root_of=unresolved)
    snap = snapshot_of(m1, m2, s, c1, c2, finish=declared(c2))
    out = traces(snap)
    seg = trace_of(out, c1)
    assert (seg.kind, seg.segment, seg.mask_sample, seg.mask_reasons) == ("compaction", 1, False, [])
    assert not out.mask_sample, out.mask_reasons
    # the terminal delivery sees only an unresolved parent at the root of its chain
    assert codes(rebuild(snap)) == [MaskCode.UNRESOLVED_PARENT]


# -- declarations and agent headers -------------------------------------------------------------


def test_a_declared_subagent_decides_kind_and_label():
    m1 = root([1, 2], [3])
    m2 = child(m1, [4], [5])
    s1 = root([50], [51], facts={"tools_present": True, "trace_declared": "subagent:planner"})
    out = traces(snapshot_of(m1, m2, s1, finish=declared(m2)))
    sub = trace_of(out, s1)
    assert (sub.kind, sub.label, sub.classified_by, sub.attachment) == ("subagent", "planner", "declared", None)
    assert not sub.mask_sample


def test_a_declared_subagent_still_finds_its_agent_call_and_keeps_the_declared_label():
    m1 = root([1, 2], [3], output_items_json=agent_items("toolu_9", "go", subagent_type="Explore"))
    m2 = child(m1, [4], [5])
    s1 = root([50], [51], facts=opening("go", trace_declared="subagent:planner"))
    out = traces(snapshot_of(m1, m2, s1, finish=declared(m2)))
    sub = trace_of(out, s1)
    assert (sub.label, sub.classified_by) == ("planner", "declared")
    assert sub.attachment == TraceAttachment(call_id=m1.model_call_id, tool_call_id="toolu_9")
    assert sub.parent_trace == owner(out, m1)


def test_main_declared_on_a_root_that_is_not_the_terminals_makes_the_rollout_ambiguous():
    m1 = root([1, 2], [3])
    m2 = child(m1, [4], [5])
    x = root([50], [51], facts={"tools_present": True, "trace_declared": "main"})
    out = traces(snapshot_of(m1, m2, x, finish=declared(m2)))
    assert out.mask_sample and MaskCode.TRACE_AMBIGUOUS in codes(out)
    ambiguous = next(r for r in out.mask_reasons if r.code == MaskCode.TRACE_AMBIGUOUS)
    assert ambiguous.call_ids == ids(x)


def test_a_call_declared_side_is_a_side_call_in_a_side_trace():
    m1 = root([1, 2], [3])
    m2 = child(m1, [4], [5])
    title = root([700], [701, 702], facts={"tools_present": True, "trace_declared": "side:title"})
    out = traces(snapshot_of(m1, m2, title, finish=declared(m2)))
    assert not out.mask_sample, out.mask_reasons
    rule = {"call_id": title.model_call_id, "rule": "declared", "requested_model": "policy"}
    assert rule in detail(out)["side_calls"]
    side = trace_of(out, title)
    assert (side.kind, side.label, side.trajectory, side.loss_tokens) == ("side", "declared", None, 0)
    assert sum(t.loss_tokens for t in out.traces) == gen(m1, m2)


def test_a_declared_policy_trace_is_never_a_side_call_whatever_model_it_requests():
    m1 = root([1, 2], [3])
    m2 = child(m1, [4], [5])
    helper = root([700], [701], requested_model="claude-haiku-4",
                  facts={"tools_present": True, "trace_declared": "subagent:helper"})
    out = traces(snapshot_of(m1, m2, helper, finish=declared(m2)), side_call_models=("haiku",))
    assert detail(out)["side_calls"] == []
    sub = trace_of(out, helper)
    assert (sub.kind, sub.label, sub.loss_tokens) == ("subagent", "helper", gen(helper))


def test_an_agent_header_without_a_tool_match_names_a_subagent_without_attachment():
    m1 = root([1, 2], [3])
    m2 = child(m1, [4], [5])
    s1 = root([50], [51], facts={"tools_present": True, "agent_name": "reviewer"})
    out = traces(snapshot_of(m1, m2, s1, finish=declared(m2)))
    sub = trace_of(out, s1)
    assert (sub.kind, sub.label, sub.classified_by) == ("subagent", "reviewer", "agent_header")
    assert sub.attachment is None and sub.parent_trace == -1 and not sub.mask_sample
