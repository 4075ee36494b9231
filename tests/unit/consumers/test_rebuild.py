"""Pure rebuild from folded snapshots: chains, projection, masks (no broker)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from consumers.rebuild import RebuildRules, rebuild, to_json_dict
from processors.fold import apply_writes, fold
from schemas.codec import decode_rebuilt, encode_rebuilt
from schemas.hashing import compute_digest
from schemas.records import ParentResolution
from tests.factories import event, finished, incomplete, make_call

R = "rollout-r"


def snapshot_of(*bodies):
    state: dict = {}
    snaps = []
    for body in (*bodies, finished()):
        res = fold(state, event(R, body))
        apply_writes(state, res)
        snaps.extend(res.snapshots)
    return snaps[-1]


def chain3():
    """Gym's append-only example: c1 [1,2,3]->[10,11], c2 [..,4,5]->[12], c3 [..,6]->[13,14]."""
    c1 = make_call([1, 2, 3], [10, 11], continuation_fingerprint="f1")
    c2 = make_call([1, 2, 3, 10, 11, 4, 5], [12], parent=c1.model_call_id, parent_digest=c1.digest,
                   request_fingerprint="f1", continuation_fingerprint="f2")
    c3 = make_call([1, 2, 3, 10, 11, 4, 5, 12, 6], [13, 14], request_fingerprint="f2",
                   resolution=ParentResolution.UNRESOLVED)
    return c1, c2, c3


def test_clean_chain_rebuilds_unmasked_with_contiguous_projection():
    c1, c2, c3 = chain3()
    out = rebuild(snapshot_of(c1, c2, c3))
    assert not out.mask_sample and out.mask_reasons == []
    t = out.trajectory
    assert t.token_ids == [1, 2, 3, 10, 11, 4, 5, 12, 6, 13, 14]
    assert list(t.loss_mask) == [0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1]
    assert t.log_probs == c1.generation_log_probs + c2.generation_log_probs + c3.generation_log_probs
    resp = json.loads(out.response_json)
    prompts = [i["prompt_token_ids"] for i in resp["output"] if "generation_token_ids" in i]
    assert [len(p) for p in prompts] == [3, 7, 9]
    assert resp["usage"] == {"input_tokens": 3, "output_tokens": 5}
    m = out.metrics
    assert (m.n_calls, m.roots, m.chains, m.delivered_fraction) == (3, 1, 1, 1.0)
    assert decode_rebuilt(encode_rebuilt(out)) == out
    j = to_json_dict(out)
    assert j["mask_sample"] is False and j["_ng_token_capture"]["chain_call_ids"] == [[c1.model_call_id, c2.model_call_id, c3.model_call_id]]


def test_order_of_capture_does_not_change_the_result():
    c1, c2, c3 = chain3()
    a = rebuild(snapshot_of(c1, c2, c3))
    # c3 arrives as a cold full-prompt call before nothing else changes: same trajectory
    b = rebuild(snapshot_of(c1, dataclasses.replace(c2, parent_call_id=None, parent_digest="",
                                                    parent_resolution=ParentResolution.UNRESOLVED,
                                                    parent_resolution_reason="index_cold"), c3))
    assert a.trajectory == b.trajectory and not b.mask_sample


def test_incomplete_masks_with_reason():
    c1, c2, _ = chain3()
    out = rebuild(snapshot_of(c1, c2, incomplete("d" * 32, "upstream_error")))
    assert out.mask_sample
    assert out.mask_reasons[0].code == "capture_incomplete" and "upstream_error" in out.mask_reasons[0].detail
    assert out.trajectory is not None  # evidence still rebuilt for diagnosis


def test_two_roots_mask_and_unresolved_boundary_is_reported():
    c1, c2, _ = chain3()
    other = make_call([90, 91], [92], request_fingerprint="zzz", resolution=ParentResolution.UNRESOLVED)
    out = rebuild(snapshot_of(c1, c2, other))
    codes = [r.code for r in out.mask_reasons]
    assert "unresolved_parent" in codes and "multiple_roots" in codes
    assert out.metrics.roots == 2 and out.metrics.chains == 2 and out.metrics.delivered_fraction == 0.75


def test_empty_generation_is_excluded_and_its_child_recovers_the_link():
    c1 = make_call([1, 2], [3], continuation_fingerprint="f1")
    empty = make_call([1, 2, 3, 4], [], parent=c1.model_call_id, parent_digest=c1.digest,
                      request_fingerprint="f1", continuation_fingerprint="f2")
    child = make_call([1, 2, 3, 4, 5], [6], parent=empty.model_call_id, parent_digest=empty.digest,
                      request_fingerprint="f2")
    out = rebuild(snapshot_of(c1, empty, child))
    assert not out.mask_sample
    assert out.metrics.empty_generation_calls == 1
    assert out.metrics.parent_link_failures == {"parent_call_id_missing_recovered": 1}
    assert out.trajectory.token_ids == [1, 2, 3, 4, 5, 6]


def test_mid_rollout_retry_is_quarantined_and_final_retry_masks():
    root = make_call([1, 2], [3], continuation_fingerprint="f0")
    kept = make_call([1, 2, 3, 4], [5], parent=root.model_call_id, parent_digest=root.digest, request_fingerprint="f0",
                     continuation_fingerprint="fk")
    dropped = make_call([1, 2, 3, 4], [9], parent=root.model_call_id, parent_digest=root.digest,
                        request_fingerprint="f0", continuation_fingerprint="fd")
    nxt = make_call([1, 2, 3, 4, 5, 6], [7], parent=kept.model_call_id, parent_digest=kept.digest, request_fingerprint="fk")
    out = rebuild(snapshot_of(root, kept, dropped, nxt))
    assert not out.mask_sample
    assert out.metrics.quarantined_calls == 1 and json.loads(out.metrics.detail_json)["quarantined_call_ids"] == [dropped.model_call_id]
    out2 = rebuild(snapshot_of(root, kept, dropped))
    assert out2.mask_sample and [r.code for r in out2.mask_reasons] == ["unresolved_retry"]


def test_corrupted_digest_masks_instead_of_delivering_wrong_tokens():
    c1, c2, _ = chain3()
    bad = dataclasses.replace(c2, digest=compute_digest([7, 7, 7]))
    out = rebuild(snapshot_of(c1, bad))
    assert out.mask_sample and any(r.code == "build_error" for r in out.mask_reasons)


def test_long_chain_builds_without_recursion():
    calls, prompt, parent = [], [1], None
    for i in range(1100):
        gen = [2 + i % 50]
        call = make_call(prompt, gen, parent=parent.model_call_id if parent else None,
                         parent_digest=parent.digest if parent else "",
                         request_fingerprint=f"f{i - 1}" if parent else "", continuation_fingerprint=f"f{i}")
        calls.append(call)
        prompt, parent = prompt + gen + [3], call
    out = rebuild(snapshot_of(*calls), RebuildRules(project_response=False))
    assert not out.mask_sample and out.metrics.chains == 1 and len(out.trajectory.spans) == 1100
