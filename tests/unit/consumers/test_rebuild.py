"""Pure rebuild, NeMo Gym's builder/projection behaviours (gym_inventory §8 "Builder / projection")."""

from __future__ import annotations

import dataclasses
import json
import random
from collections import Counter

import pytest

from consumers.rebuild import RebuildRules, assert_prefix_contiguity, rebuild, to_json_dict
from consumers.rebuild import links as links_module
from consumers.rebuild import trajectory as trajectory_module
from consumers.rebuild.trajectory import ChainError
from schemas.codec import decode_rebuilt, encode_rebuilt
from schemas.hashing import compute_digest
from schemas.records import CallSpan, ParentResolution, SnapshotCall, VersionSpan
from tests.factories import finished, make_call
from tests.unit.consumers.support import (
    child,
    codes,
    declared,
    detail,
    reordered,
    root,
    snapshot_of,
    tokens,
    unresolved,
)


def chain3():
    """Gym's append-only example: c1 [1,2,3]->[10,11], c2 [..,4,5]->[12], c3 [..,6]->[13,14]."""
    c1 = root([1, 2, 3], [10, 11])
    c2 = child(c1, [4, 5], [12])
    c3 = child(c2, [6], [13, 14])
    return c1, c2, c3


# -- one contiguous chain, projection ------------------------------------------------

def test_one_contiguous_chain_is_delivered_with_contiguous_projection_and_usage():
    c1, c2, c3 = chain3()
    out = rebuild(snapshot_of(c1, c2, c3))
    assert not out.mask_sample and out.mask_reasons == []
    t = out.trajectory
    assert t.token_ids == [1, 2, 3, 10, 11, 4, 5, 12, 6, 13, 14]
    assert list(t.loss_mask) == [0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1]
    assert t.log_probs == c1.generation_log_probs + c2.generation_log_probs + c3.generation_log_probs
    assert t.prompt_len == 3
    assert [(s.start, s.generation_start, s.end) for s in t.spans] == [(0, 3, 5), (5, 7, 8), (8, 9, 11)]
    resp = json.loads(out.response_json)
    carriers = [i for i in resp["output"] if "generation_token_ids" in i]
    assert [len(i["prompt_token_ids"]) for i in carriers] == [3, 7, 9]
    assert carriers[2]["prompt_token_ids"] == [1, 2, 3, 10, 11, 4, 5, 12, 6]
    assert resp["usage"] == {"input_tokens": 3, "output_tokens": 5}
    assert resp["id"] == "proj-rollout-r" and resp["object"] == "response"
    assert_prefix_contiguity(resp["output"])
    m = out.metrics
    assert (m.n_calls, m.roots, m.chains, m.delivered_fraction) == (3, 1, 1, 1.0)
    assert (m.terminal_attribution.method, m.terminal_attribution.call_id) == ("single_chain", c3.model_call_id)
    assert decode_rebuilt(encode_rebuilt(out)) == out
    j = to_json_dict(out)
    assert j["mask_sample"] is False
    assert j["_ng_token_capture"]["delivered_call_ids"] == [c.model_call_id for c in (c1, c2, c3)]


def test_snapshot_stores_delta_suffixes_and_rebuild_restores_the_exact_prompts():
    c1, c2, c3 = chain3()
    snap = snapshot_of(c1, c2, c3)
    stored = {sc.call.model_call_id: sc.call for sc in snap.calls}
    assert stored[c2.model_call_id].prompt_is_delta and stored[c2.model_call_id].prompt_token_ids == [4, 5]
    out = rebuild(snap)
    spans = out.trajectory.spans
    assert out.trajectory.token_ids[: spans[2].generation_start] == c3.prompt_token_ids


def test_1100_call_chain_builds_without_recursion():
    calls, parent = [], None
    for i in range(1100):
        call = root([1], [2 + i % 50]) if parent is None else child(parent, [3], [2 + i % 50])
        calls.append(call)
        parent = call
    out = rebuild(snapshot_of(*calls))
    assert not out.mask_sample and out.metrics.chains == 1 and len(out.trajectory.spans) == 1100
    assert_prefix_contiguity(json.loads(out.response_json)["output"])


def test_capture_order_does_not_change_the_record():
    c1, c2, c3 = chain3()
    side = root([9, 9], [8], created_at=0.5)
    snap = snapshot_of(c1, c2, c3, side, finish=declared(c3))
    expected = encode_rebuilt(rebuild(snap))
    for _ in range(5):
        order = list(range(len(snap.calls)))
        random.Random(_).shuffle(order)
        assert encode_rebuilt(rebuild(reordered(snap, order))) == expected


def test_rebuild_is_byte_identical_for_the_same_input():
    snap = snapshot_of(*chain3())
    assert encode_rebuilt(rebuild(snap)) == encode_rebuilt(rebuild(snap))


def test_the_delivered_chain_is_hashed_once_not_per_call(monkeypatch):
    calls, parent = [], None
    for i in range(40):
        call = root([1, 2], [5]) if parent is None else child(parent, [6, 7], [5, i])
        calls.append(call)
        parent = call
    snap = snapshot_of(*calls)
    seen = []
    real = trajectory_module.compute_digest
    monkeypatch.setattr(trajectory_module, "compute_digest", lambda ids: seen.append(len(ids)) or real(ids))
    monkeypatch.setattr(links_module, "compute_digest", lambda ids: seen.append(len(ids)) or real(ids))
    assert not rebuild(snap).mask_sample
    assert seen == [calls[-1].cum_len]


def test_a_forged_lineage_cycle_is_cut_and_its_members_become_boundaries():
    a, b, c = root([1], [2]), root([3], [4]), root([5], [6])
    nodes = [links_module.Node(call, i, False, "", list(call.prompt_token_ids)) for i, call in enumerate((a, b, c))]
    nodes[0].parent, nodes[1].parent, nodes[2].parent = nodes[1], nodes[0], nodes[1]  # a <-> b, and c below b
    links = links_module.Links({}, [], Counter(), [], [], [])
    assert links_module._break_cycles(nodes, links)
    assert [n.boundary for n in nodes] == ["lineage_cycle", "lineage_cycle", None]
    assert nodes[0].parent is None and nodes[1].parent is None and nodes[2].parent is nodes[1]
    assert links.unresolved == [a.model_call_id, b.model_call_id]
    assert not links_module._break_cycles(nodes, links_module.Links({}, [], Counter(), [], [], []))  # cut for good


def test_call_spans_built_by_their_slots_setters_equal_the_records_own(monkeypatch):
    values = ("c1", 0, 2, 5, "v1,v2", [VersionSpan(version="v1", start=2, end=3)], "engine", "v0")
    fast = trajectory_module._call_span(*values)
    assert trajectory_module._call_span.__name__ == "make"  # the setters: CallSpan is the record they were written for
    assert type(fast) is CallSpan and fast == CallSpan(**dict(zip(trajectory_module._SPAN_FIELDS, values)))
    assert repr(fast) == repr(CallSpan(**dict(zip(trajectory_module._SPAN_FIELDS, values))))
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.start = 1

    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class Wider:  # the record grew a field: its own constructor builds it, with the field's default
        model_call_id: str
        start: int
        generation_start: int
        end: int
        policy_version: str | None = None
        version_spans: list = dataclasses.field(default_factory=list)
        version_source: str = ""
        dispatch_version: str | None = None
        extra: int = 7

    monkeypatch.setattr(trajectory_module, "CallSpan", Wider)
    assert trajectory_module._span_maker()(*values) == Wider(**dict(zip(trajectory_module._SPAN_FIELDS, values)))


# -- carrier items and content -------------------------------------------------------

ITEMS = [
    {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "think"}]},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking it up."}]},
    {"type": "function_call", "call_id": "t1", "name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"},
]


def _projection(call):
    return json.loads(rebuild(snapshot_of(call)).response_json)["output"]


def test_recorded_carrier_index_is_honoured_and_other_items_carry_no_tokens():
    out = _projection(root([1, 2], [3, 4], output_items_json=json.dumps(ITEMS), token_item_index=1))
    assert [("generation_token_ids" in i) for i in out] == [False, True, False]
    assert out[1]["prompt_token_ids"] == [1, 2] and out[1]["generation_token_ids"] == [3, 4]
    # content preserved verbatim, leading content-only item included
    assert out[0] == ITEMS[0] and out[2] == ITEMS[2]
    assert out[1]["content"] == ITEMS[1]["content"]


def test_legacy_records_carry_tokens_on_the_item_that_had_them_inline_else_the_last():
    legacy = [dict(ITEMS[1]), {**ITEMS[2], "generation_token_ids": [3, 4], "prompt_token_ids": [0]}]
    out = _projection(root([1, 2], [3, 4], output_items_json=json.dumps(legacy), token_item_index=None))
    assert "generation_token_ids" not in out[0] and out[1]["prompt_token_ids"] == [1, 2]
    plain = _projection(root([1, 2], [3, 4], output_items_json=json.dumps(ITEMS[:2]), token_item_index=None))
    assert [("generation_token_ids" in i) for i in plain] == [False, True]


def test_an_index_outside_the_items_is_refused_not_guessed():
    # Issue 26: it used to fall back to the last item, so a direct producer's forged index was delivered unmasked.
    out = rebuild(snapshot_of(root([1, 2], [3, 4], output_items_json=json.dumps(ITEMS[:2]), token_item_index=7)))
    assert out.mask_sample and out.response_json is None
    assert any("token_item_index=7 is outside its 2 output" in m.detail for m in out.mask_reasons), out.mask_reasons


def test_a_call_without_items_gets_a_synthesized_message():
    out = _projection(root([1, 2], [3], output_items_json="[]", token_item_index=None))
    assert out == [{"type": "message", "role": "assistant", "content": [], "prompt_token_ids": [1, 2],
                    "generation_token_ids": [3], "generation_log_probs": [-0.5]}]


def test_routed_experts_ride_on_the_carrier():
    out = _projection(root([1], [2, 3], routed_experts_json="[[[1,2]],[[3,4]]]"))
    assert out[0]["routed_experts"] == [[[1, 2]], [[3, 4]]]


def test_contiguity_assertion_catches_a_gap_and_a_log_prob_mismatch():
    good = [{"prompt_token_ids": [1], "generation_token_ids": [2], "generation_log_probs": [-1.0]},
            {"type": "function_call"},
            {"prompt_token_ids": [1, 2, 5], "generation_token_ids": [6], "generation_log_probs": [-1.0]}]
    assert_prefix_contiguity(good)
    gap = [good[0], {**good[2], "prompt_token_ids": [1, 9, 5]}]
    with pytest.raises(ChainError, match="do not extend"):
        assert_prefix_contiguity(gap)
    with pytest.raises(ChainError, match="one log-prob"):
        assert_prefix_contiguity([{**good[0], "generation_log_probs": []}])


def test_projection_can_be_turned_off_and_the_trajectory_stays():
    out = rebuild(snapshot_of(*chain3()), RebuildRules(project_response=False))
    assert out.response_json is None and out.trajectory is not None and not out.mask_sample


# -- links ---------------------------------------------------------------------------

def test_final_retry_resolved_by_the_next_calls_link():
    r = root([1, 2], [3])
    kept = child(r, [4], [5])
    dropped = child(r, [4], [9])
    nxt = child(kept, [6], [7])
    out = rebuild(snapshot_of(r, kept, dropped, nxt))
    assert not out.mask_sample
    assert detail(out)["quarantined_call_ids"] == [dropped.model_call_id]
    assert out.metrics.quarantined_calls == 1 and out.metrics.quarantined_fraction == 0.25
    assert [s.model_call_id for s in out.trajectory.spans] == [r.model_call_id, kept.model_call_id, nxt.model_call_id]


def test_unresolvable_final_retry_masks_with_the_group():
    r = root([1, 2], [3])
    a, b = child(r, [4], [5]), child(r, [4], [9])
    out = rebuild(snapshot_of(r, a, b))
    assert out.mask_sample and codes(out) == ["unresolved_retry"]
    assert out.mask_reasons[0].call_ids == sorted([a.model_call_id, b.model_call_id])
    assert detail(out)["unresolved_retries"] == [sorted([a.model_call_id, b.model_call_id])]


def test_stale_link_becomes_a_fragment_and_is_never_merged():
    old = root([1, 2, 3], [4, 5])
    claim = make_call([90, 91, 92, 93], [94], parent=old.model_call_id, parent_digest=old.digest,
                      request_fingerprint=old.continuation_fingerprint, facts={"tools_present": True})
    out = rebuild(snapshot_of(old, claim), RebuildRules(delivery_mode="gym"))
    m = out.metrics
    assert m.parent_link_failures == {"parent_digest_mismatch": 1}
    assert (m.roots, m.chains) == (2, 2) and "unresolved_parent" in codes(out)
    assert all(len(c["call_ids"]) == 1 for c in detail(out)["chain_reports"])


def test_recorded_parent_is_verified_not_trusted():
    r = root([1, 2], [3])
    c = child(r, [4], [5])
    snap = snapshot_of(r, c)
    forged = dataclasses.replace(snap, calls=[snap.calls[0], dataclasses.replace(
        snap.calls[1], call=dataclasses.replace(snap.calls[1].call, parent_digest=compute_digest([7])))])
    out = rebuild(forged, RebuildRules(delivery_mode="gym"))
    assert out.metrics.parent_link_failures == {"delta_chain_unreconstructable": 1}
    assert out.mask_sample and out.metrics.quarantined_calls == 1
    # a full-prompt claim (not written by our fold) is verified against the prefix digest
    full = make_call([1, 2, 8, 4], [5], parent=r.model_call_id)
    out2 = rebuild(dataclasses.replace(snap, calls=[snap.calls[0], SnapshotCall(seq=1, call=full)]))
    assert out2.metrics.parent_link_failures == {"parent_digest_mismatch": 1}


def test_the_recorded_link_is_used_among_identical_candidates():
    a = root([1, 2], [3], created_at=1.0)
    b = root([1, 2], [3], created_at=2.0)
    c = make_call([1, 2, 3, 4], [5], parent=b.model_call_id, parent_digest=b.digest, facts={"tools_present": True})
    snap = snapshot_of(a, b, c)
    out = rebuild(snap)
    assert [s.model_call_id for s in out.trajectory.spans] == [b.model_call_id, c.model_call_id]
    assert detail(out)["quarantined_call_ids"] == [a.model_call_id] and not out.mask_sample


def test_missing_parent_is_recovered_by_digest_and_by_prefix():
    r = root([1, 2], [3])
    c = child(r, [4], [5])
    snap = snapshot_of(r, c)
    twin = dataclasses.replace(snap.calls[0].call, model_call_id="f" * 32)  # identical tokens, other id
    lost = dataclasses.replace(snap, calls=[SnapshotCall(seq=0, call=twin), snap.calls[1]])
    out = rebuild(lost)
    assert out.metrics.parent_link_failures == {"parent_call_id_missing_recovered": 1} and not out.mask_sample
    full = make_call([1, 2, 3, 4], [5], parent="e" * 32)  # full prompt, parent absent: longest verified prefix
    out2 = rebuild(dataclasses.replace(snap, calls=[snap.calls[0], SnapshotCall(seq=1, call=full)]))
    assert out2.metrics.parent_link_failures == {"parent_call_id_missing_recovered": 1}
    assert out2.trajectory.token_ids == [1, 2, 3, 4, 5] and not out2.mask_sample


def test_unresolved_and_root_calls_never_use_prefix_recovery():
    r = root([1, 2], [3])
    u = unresolved([1, 2, 3, 4], [5])
    again = make_call([1, 2, 3, 4], [6], facts={"tools_present": True})  # explicit ROOT extending r's tokens
    out = rebuild(snapshot_of(r, u, again), RebuildRules(delivery_mode="gym"))
    assert out.metrics.roots == 3 and out.metrics.parent_link_failures == {"parent_unresolved": 1}


def test_duplicate_entry_is_one_call_and_a_conflicting_one_is_counted():
    c1, c2, c3 = chain3()
    snap = snapshot_of(c1, c2, c3)
    dup = dataclasses.replace(snap, calls=[*snap.calls, dataclasses.replace(snap.calls[1], seq=9)])
    out = rebuild(dup)
    assert out.metrics.n_calls == 3 and out.metrics.chains == 1 and not out.mask_sample
    bad = dataclasses.replace(snap.calls[1].call, generation_token_ids=[77], generation_log_probs=[-1.0])
    conflict = dataclasses.replace(snap, calls=[*snap.calls, SnapshotCall(seq=9, call=bad)])
    out2 = rebuild(conflict)
    assert out2.metrics.parent_link_failures["duplicate_call_id_conflict"] == 1


def test_broken_delta_chain_is_split_reported_and_masks_when_delivered():
    c1, c2, c3 = chain3()
    snap = snapshot_of(c1, c2, c3, finish=declared(c3))
    broken = dataclasses.replace(snap, calls=[snap.calls[0], snap.calls[2]])  # c2 lost from the snapshot
    out = rebuild(broken)
    assert out.mask_sample and codes(out) == ["unresolved_parent"]
    assert out.metrics.parent_link_failures == {"delta_chain_unreconstructable": 1}
    assert detail(out)["quarantined_call_ids"] == [c3.model_call_id] and out.trajectory is None


# -- empty generations ---------------------------------------------------------------

def test_empty_generation_is_excluded_never_a_parent_and_its_child_recovers_the_link():
    c1 = root([1, 2], [3])
    empty = child(c1, [4], [])
    grandchild = child(empty, [5], [6])
    out = rebuild(snapshot_of(c1, empty, grandchild))
    assert not out.mask_sample
    assert out.metrics.empty_generation_calls == 1
    assert out.metrics.parent_link_failures == {"parent_call_id_missing_recovered": 1}
    assert out.trajectory.token_ids == [1, 2, 3, 4, 5, 6]
    assert list(out.trajectory.loss_mask) == [0, 0, 1, 0, 0, 1]


def test_all_empty_rollout_is_masked():
    out = rebuild(snapshot_of(root([1, 2], []), root([3], [])))
    assert out.mask_sample and codes(out) == ["no_generated_tokens"] and out.trajectory is None


def test_no_calls_is_masked():
    out = rebuild(snapshot_of())
    assert out.mask_sample and codes(out) == ["no_calls"] and out.metrics.error == "capture contains no token records"


# -- selection (delivery) ------------------------------------------------------------

def test_earliest_extended_root_is_selected_and_other_chains_are_reported():
    side = root([9000, 9001], [7, 7, 7], created_at=200.0)
    real1 = root(list(range(60)), [1, 2, 3, 4], created_at=100.0)
    real2 = child(real1, [5], [6, 7, 8], created_at=101.0)
    out = rebuild(snapshot_of(side, real1, real2))
    assert not out.mask_sample
    assert [s.model_call_id for s in out.trajectory.spans] == [real1.model_call_id, real2.model_call_id]
    assert (out.metrics.chains, out.metrics.delivered_fraction) == (2, 0.7)
    kinds = {c["kind"] for c in detail(out)["chain_reports"]}
    assert kinds == {"delivered", "other_root"}


def test_orchestrator_is_selected_over_a_later_sub_agent():
    orchestrator = root(list(range(60)), [1, 2], created_at=100.0)
    sub_agent = root([9000, 9001], list(range(60)), created_at=120.0)
    # Gym's selection (earliest root, not generated-token mass), in gym mode:
    gym = rebuild(snapshot_of(orchestrator, sub_agent), RebuildRules(delivery_mode="gym"))
    assert gym.metrics.terminal_attribution.call_id == orchestrator.model_call_id and gym.mask_sample
    # Ours: two one-call conversations and no evidence is ambiguous; evidence decides.
    guess = rebuild(snapshot_of(orchestrator, sub_agent))
    assert guess.mask_sample and codes(guess) == ["terminal_ambiguous"]
    out = rebuild(snapshot_of(orchestrator, sub_agent, finish=declared(orchestrator)))
    assert out.metrics.terminal_attribution.call_id == orchestrator.model_call_id
    assert out.metrics.delivered_fraction < 0.1 and not out.mask_sample


def test_an_aux_call_finishing_first_is_not_delivered():
    aux = root([5, 5], [8, 8], created_at=90.0, facts={"tools_present": False})  # title-style side call
    main = root([1, 2], [3], created_at=100.0)
    nxt = child(main, [4], [5])
    out = rebuild(snapshot_of(aux, main, nxt))
    assert out.metrics.terminal_attribution.call_id == nxt.model_call_id
    assert out.metrics.side_calls_excluded == 1 and not out.mask_sample


def test_equal_timestamps_tie_break_on_the_smaller_call_id():
    a = root([1], [2], call_id="a" * 32, created_at=5.0)
    b = root([3], [4], call_id="b" * 32, created_at=5.0)
    out = rebuild(snapshot_of(b, a), RebuildRules(delivery_mode="gym"))
    assert out.metrics.terminal_attribution.call_id == "a" * 32


def test_post_compaction_fragment_is_reported_and_the_declared_terminal_decides():
    c1 = root([1, 2], [3])
    c2 = child(c1, [4], [5])
    c3 = unresolved([90, 91], [1, 2, 3, 4])
    out = rebuild(snapshot_of(c1, c2, c3))
    assert out.mask_sample and codes(out) == ["terminal_ambiguous"]  # no evidence: the fragment may hold the answer
    assert (out.metrics.chains, out.metrics.generated_tokens_captured) == (2, 6)
    to_fragment = rebuild(snapshot_of(c1, c2, c3, finish=declared(c3)))
    assert codes(to_fragment) == ["unresolved_parent"]  # delivered ancestry starts at the boundary
    to_main = rebuild(snapshot_of(c1, c2, c3, finish=declared(c2)))
    assert not to_main.mask_sample and to_main.metrics.delivered_fraction == round(2 / 6, 4)
    assert {c["kind"] for c in detail(to_main)["chain_reports"]} == {"delivered", "fragment"}


def test_gym_mode_masks_multiple_roots_and_chains():
    c1, c2, _ = chain3()
    other = root([90, 91], [92])
    out = rebuild(snapshot_of(c1, c2, other), RebuildRules(delivery_mode="gym"))
    assert codes(out) == ["multiple_roots", "multiple_chains"]
    assert out.metrics.terminal_attribution.method == "earliest_root"
    assert not rebuild(snapshot_of(c1, c2, other)).mask_sample  # terminal mode: reported, not masked


# -- incomplete, late, errors --------------------------------------------------------

def test_incomplete_masks_with_reason_and_keeps_the_evidence():
    from tests.factories import incomplete

    c1, c2, _ = chain3()
    out = rebuild(snapshot_of(c1, c2, incomplete("d" * 32, "upstream_error")))
    assert out.mask_sample and out.metrics.capture_incomplete
    assert out.mask_reasons[0].code == "capture_incomplete" and out.mask_reasons[0].detail == "upstream_error"
    assert out.mask_reasons[0].call_ids == ["d" * 32] and out.trajectory is not None


def test_late_writes_mask_unless_the_rule_allows_them():
    from processors.replay import replay
    from tests.factories import event

    c1, c2, c3 = chain3()
    snaps = [s for step in replay(event("rollout-r", b) for b in (c1, c2, finished(), c3, finished()))
             for s in step.snapshots]
    out = rebuild(snaps[-1])
    assert codes(out) == ["late_write"] and out.mask_reasons[0].call_ids == [c3.model_call_id]
    assert not rebuild(snaps[-1], RebuildRules(mask_late_writes=False)).mask_sample


def test_corrupted_tokens_mask_instead_of_delivering_wrong_tokens():
    c1, c2, _ = chain3()
    snap = snapshot_of(c1, c2)
    stored = snap.calls[1].call
    bad = dataclasses.replace(stored, prompt_token_ids=[4, 6])  # same lengths, other tokens
    out = rebuild(dataclasses.replace(snap, calls=[snap.calls[0], dataclasses.replace(snap.calls[1], call=bad)]))
    assert out.mask_sample and codes(out) == ["build_error"] and "digest" in out.mask_reasons[0].detail
    assert out.trajectory is None and out.metrics.error


def test_a_build_exception_masks_one_rollout_and_never_escapes(monkeypatch):
    import consumers.rebuild.builder as builder

    monkeypatch.setattr(builder, "build_forest", lambda *a: (_ for _ in ()).throw(KeyError("boom")))
    out = rebuild(snapshot_of(*chain3()))
    assert out.mask_sample and codes(out) == ["build_error"] and "KeyError" in out.metrics.error


def test_generation_log_probs_must_be_one_per_token():
    c1 = root([1], [2, 3])
    snap = snapshot_of(c1)
    call = snap.calls[0].call
    object.__setattr__(call, "generation_log_probs", [-1.0])  # forge past the record's own check
    out = rebuild(snap)
    assert out.mask_sample and "one per token" in out.mask_reasons[0].detail
    assert tokens(c1) == [1, 2, 3]
    assert ParentResolution.ROOT is c1.parent_resolution
