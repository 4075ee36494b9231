"""A full-prompt child folded before its parent, or whose parent is lost: the record does not depend on the order.

The interceptor claims a parent at request time; when the claimed parent's events reach the log after
the child's (a spool drained after the broker came back) or never (lost without a marker), the
processor cannot verify the claim when it folds the child. It defers (``parent_missing``) and the
rebuild decides with every call known: the same record as the causal order gives, or NeMo Gym's
recovery onto the nearest verified ancestor (``parent_call_id_missing_recovered``). An ambiguity is
never recovered from. Everything goes through the real fold (``processors.replay``) and ``rebuild``.
"""

from __future__ import annotations

import itertools

import pytest

from consumers.rebuild import RebuildRules, rebuild
from processors.replay import replay
from schemas.records import ParentResolution, RebuiltRollout
from tests.factories import event, hashed, make_call, started
from tests.unit.consumers.support import R, child, codes, declared, detail, root, tokens, unresolved

GYM = RebuildRules(delivery_mode="gym")


def claimed_full(parent, extra, gen, **kw):
    """A child whose parent the interceptor claimed, published with its full prompt (no delta)."""
    call = child(parent, extra, gen, **kw)
    assert call.parent_resolution is ParentResolution.RESOLVED and not call.prompt_is_delta
    return call


def conversation():
    """Four turns: the two middle children are claimed full prompts, the last one too."""
    c1 = root([1, 2, 3], [10, 11])
    c2 = claimed_full(c1, [4, 5], [12])
    c3 = claimed_full(c2, [6], [13, 14])
    c4 = claimed_full(c3, [7, 8], [15])
    return [c1, c2, c3, c4]


def fold(calls, finish, order=None, *, rules=RebuildRules()) -> RebuiltRollout:
    """Fold each call's intent and capture (in ``order``), then the finish; rebuild the last snapshot."""
    order = range(len(calls)) if order is None else order
    events = [e for i in order for e in (event(R, started(calls[i].model_call_id)), event(R, calls[i]))]
    snapshots = [s for step in replay([*events, event(R, finish)]) for s in step.snapshots]
    return rebuild(snapshots[-1], rules)


def test_a_child_folded_before_its_parent_is_delivered_as_in_causal_order_whatever_the_order():
    calls = conversation()
    finish = declared(calls[-1])
    causal = fold(calls, finish)
    assert not causal.mask_sample and causal.metrics.parent_link_failures == {}
    assert detail(causal)["delivered_call_ids"] == [c.model_call_id for c in calls]
    assert causal.trajectory.token_ids == tokens(calls[-1])
    for order in itertools.permutations(range(len(calls))):  # spool-drain orders: children before parents
        assert fold(calls, finish, order) == causal, order
        assert fold(calls, finish, order, rules=GYM) == fold(calls, finish, rules=GYM), order


def test_the_spool_drain_order_is_delivered_unmasked_where_it_was_masked_for_good():
    c1, c2, c3, c4 = conversation()
    # The interceptor that served c1 and c2 spooled them while the broker was down; c3 and c4 got
    # through first. The processor folds the children before their parents.
    out = fold([c1, c2, c3, c4], declared(c4), order=[2, 3, 0, 1])
    assert not out.mask_sample and out.mask_reasons == []
    assert out.metrics.parent_link_failures == {} and detail(out)["recovered_call_ids"] == []
    assert out.trajectory.token_ids == tokens(c4)


def test_a_delta_child_and_a_full_prompt_child_of_a_late_parent_give_the_same_record():
    c1, c2, c3, c4 = conversation()
    # The same c3 as the interceptor stores it with delta records on: only its new prompt ids.
    delta = make_call(c3.prompt_token_ids, c3.generation_token_ids, call_id=c3.model_call_id,
                      created_at=c3.created_at, parent=c2.model_call_id, parent_digest=c2.digest,
                      delta_of=tokens(c2), request_fingerprint=c3.request_fingerprint,
                      continuation_fingerprint=c3.continuation_fingerprint, facts={"tools_present": True})
    assert delta.prompt_is_delta
    finish, drained = declared(c4), [2, 3, 0, 1]
    assert fold([c1, c2, delta, c4], finish, drained) == fold([c1, c2, c3, c4], finish, drained) \
        == fold([c1, c2, c3, c4], finish)


def test_a_parent_lost_without_a_marker_is_recovered_onto_the_nearest_verified_ancestor():
    c1, c2, c3, c4 = conversation()
    kept = [c1, c2, c4]  # c3 never reached the log: no capture, no intent, no incomplete marker
    for order in itertools.permutations(range(3)):
        out = fold(kept, declared(c4), order)
        assert not out.mask_sample and out.mask_reasons == [], order
        # As NeMo Gym reports it: a recovered link, not a boundary.
        assert out.metrics.parent_link_failures == {"parent_call_id_missing_recovered": 1}
        assert out.metrics.unresolved_parent_calls == 0
        assert detail(out)["recovered_call_ids"] == [c4.model_call_id]
        # The nearest verified ancestor is c2 (c1 verifies too, but is further): c3's turn is prompt.
        assert detail(out)["delivered_call_ids"] == [c1.model_call_id, c2.model_call_id, c4.model_call_id]
        t = out.trajectory
        assert t.token_ids == tokens(c4)
        generated = [i for i, m in enumerate(t.loss_mask) if m]
        assert [t.token_ids[i] for i in generated] == [10, 11, 12, 15]  # c3's 13, 14 are not trained
        assert t.log_probs == c1.generation_log_probs + c2.generation_log_probs + c4.generation_log_probs
        gym = fold(kept, declared(c4), order, rules=GYM)
        assert not gym.mask_sample and gym.metrics.parent_link_failures == {"parent_call_id_missing_recovered": 1}


def test_a_lost_parent_with_no_verified_ancestor_masks():
    c1 = root([1, 2, 3], [10, 11])
    lost = root([50, 51], [52])
    orphan = claimed_full(lost, [53], [54])
    out = fold([c1, orphan], declared(orphan))
    assert out.mask_sample and codes(out) == ["unresolved_parent"]
    assert out.metrics.parent_link_failures == {"parent_call_id_missing": 1}


def ambiguous_rollout():
    """A lost parent whose request fingerprint two verified calls with different tokens share."""
    p = root([1, 2], [3], continuation_fingerprint=hashed("fp-shared"))
    k = child(p, [4], [5], continuation_fingerprint=hashed("fp-shared"))  # the same fingerprint, longer tokens
    lost = child(k, [6], [7], continuation_fingerprint=hashed("fp-shared"))
    orphan = claimed_full(lost, [8], [9])
    assert orphan.request_fingerprint == hashed("fp-shared")
    return p, k, orphan


@pytest.mark.parametrize("order", [[0, 1, 2], [2, 0, 1], [2, 1, 0]])
def test_two_different_verified_ancestors_are_ambiguous_and_mask_never_guessed(order):
    p, k, orphan = ambiguous_rollout()
    out = fold([p, k, orphan], declared(orphan), order)
    # The longest verified prefix is k's, but the fingerprint says p continues too: never guessed.
    assert out.mask_sample and codes(out) == ["unresolved_parent"]
    assert out.metrics.parent_link_failures == {"parent_call_id_missing": 1}
    assert detail(out)["recovered_call_ids"] == [] and detail(out)["unresolved_parent_call_ids"] == [orphan.model_call_id]
    assert out.mask_reasons[0].call_ids == [orphan.model_call_id]


def test_a_late_parent_whose_tokens_do_not_verify_still_masks_in_either_order():
    c1 = root([1, 2, 3], [10, 11])
    drifted = make_call([1, 2, 9, 10, 11, 4], [12], parent=c1.model_call_id, parent_digest=c1.digest,
                        request_fingerprint=c1.continuation_fingerprint, continuation_fingerprint=hashed("fp-drift"),
                        facts={"tools_present": True})
    for order in ([0, 1], [1, 0]):
        out = fold([c1, drifted], declared(drifted), order)
        assert out.mask_sample and codes(out) == ["unresolved_parent"], order
        assert out.metrics.parent_link_failures == {"parent_digest_mismatch": 1}, order


def cold(parent, extra, gen, **kw):
    """A child served by an interceptor that had not seen the rollout: full prompt, UNRESOLVED, fingerprint."""
    return unresolved(tokens(parent) + list(extra), gen, request_fingerprint=parent.continuation_fingerprint, **kw)


def test_a_cold_child_folded_before_its_parent_is_resolved_as_in_causal_order():
    c1 = root([1, 2, 3], [10, 11])
    c2 = cold(c1, [4, 5], [12])  # another interceptor served it (index_cold): the processor resolves it
    c3 = claimed_full(c2, [6], [13, 14])
    calls, finish = [c1, c2, c3], declared(c3)
    causal = fold(calls, finish)
    assert not causal.mask_sample and causal.metrics.parent_link_failures == {}
    assert causal.trajectory.token_ids == tokens(c3)
    for order in itertools.permutations(range(3)):
        assert fold(calls, finish, order) == causal, order


def test_a_toolless_root_continued_only_by_a_late_resolved_child_is_no_side_call_in_either_order():
    # toolless_short: a short ROOT call without tools that nothing continues is a side call; what
    # continues it must not depend on the order the processor saw the calls in.
    opening = root([1, 2, 3], [10, 11], facts={"tools_present": False})
    for kid in (cold(opening, [4], [12]), claimed_full(opening, [4], [12])):
        finish = declared(kid)
        causal = fold([opening, kid], finish)
        assert not causal.mask_sample and detail(causal)["side_calls"] == []
        assert fold([opening, kid], finish, [1, 0]) == causal


def test_a_cold_child_nothing_verifies_for_stays_unresolved_in_either_order():
    c1 = root([1, 2, 3], [10, 11])
    drifted = unresolved([1, 2, 9, 10, 11, 4], [12], request_fingerprint=c1.continuation_fingerprint)
    for order in ([0, 1], [1, 0]):
        out = fold([c1, drifted], declared(drifted), order)
        assert out.mask_sample and out.metrics.parent_link_failures == {"parent_unresolved": 1}, order


def test_the_processor_defers_only_an_absent_claim_and_keeps_the_call_as_published():
    c1, c2, c3, _ = conversation()
    steps = list(replay([event(R, c3), event(R, c1), event(R, c2)]))
    assert steps[0].result.writes  # the child is stored before its parent
    snapshot = [s for step in replay([event(R, c3), event(R, c1), event(R, c2), event(R, declared(c3))])
                for s in step.snapshots][-1]
    stored = {sc.call.model_call_id: sc for sc in snapshot.calls}
    assert stored[c3.model_call_id].lineage_note == f"parent_missing:{c2.model_call_id}"
    assert stored[c3.model_call_id].call == c3  # full prompt, claim kept: the rebuild decides
    assert stored[c2.model_call_id].lineage_note == "verified" and stored[c2.model_call_id].call.prompt_is_delta
