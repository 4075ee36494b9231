"""The four golden scenarios of gym_inventory §6.7, with their expected token rows.

GATE stores log-probs as float32; tokentrail keeps the engine's float64 values
bit-exact, so the expected log-probs below are the values captured.
"""

from __future__ import annotations

import json

from consumers.rebuild import rebuild, to_json_dict, to_json_line
from tests.factories import incomplete
from tests.unit.consumers.support import child, declared, detail, root, snapshot_of


def test_single_call():
    a1 = root([5, 6, 7, 8], [9], log_probs=[-0.25], facts={"policy_version": "7"})
    out = rebuild(snapshot_of(a1))
    t = out.trajectory
    assert not out.mask_sample and out.metrics.terminal_attribution.call_id == a1.model_call_id
    assert t.token_ids == [5, 6, 7, 8, 9] and list(t.loss_mask) == [0, 0, 0, 0, 1]
    assert t.log_probs == [-0.25] and t.prompt_len == 4
    assert [s.policy_version for s in t.spans] == ["7"]


def test_worked_example_delivers_the_declared_terminals_ancestry_only():
    c1 = root([10, 11, 12], [13, 14], log_probs=[-0.125, -1.75], facts={"policy_version": "4"})
    c2 = child(c1, [20, 21, 22], [23, 24], log_probs=[-2.3, -0.5], facts={"policy_version": "4"})
    c3 = child(c1, [30, 31], [32, 33], facts={"policy_version": "4"})  # fork
    c4 = root([40, 41, 42, 43, 44, 45, 46], [47, 48], created_at=1e9, facts={"policy_version": "4"})
    out = rebuild(snapshot_of(c1, c2, c3, c4, finish=declared(c2, result={"reward": 1})))
    t = out.trajectory
    assert not out.mask_sample
    assert t.token_ids == [10, 11, 12, 13, 14, 20, 21, 22, 23, 24]
    assert list(t.loss_mask) == [0, 0, 0, 1, 1, 0, 0, 0, 1, 1]
    assert t.log_probs == [-0.125, -1.75, -2.3, -0.5] and t.prompt_len == 3
    assert [s.model_call_id for s in t.spans] == [c1.model_call_id, c2.model_call_id]
    assert json.loads(out.result_json) == {"reward": 1}
    kinds = sorted(c["kind"] for c in detail(out)["chain_reports"])
    assert kinds == ["abandoned", "delivered", "other_root"]
    assert out.metrics.terminal_attribution.method == "declared"


def test_capture_failed_call_masks_but_the_row_is_still_built_for_diagnosis():
    k1 = root([100, 101], [102, 103, 104], log_probs=[-0.1, -0.2, -0.3])
    out = rebuild(snapshot_of(k1, incomplete("b" * 32, "upstream_error"), finish=declared(k1, result={"reward": 0.5})))
    assert out.mask_sample and [r.code for r in out.mask_reasons] == ["capture_incomplete"]
    assert out.metrics.capture_incomplete and out.metrics.terminal_attribution.call_id == k1.model_call_id
    assert out.trajectory.token_ids == [100, 101, 102, 103, 104]
    assert list(out.trajectory.loss_mask) == [0, 0, 1, 1, 1]


def test_mixed_weight_versions_are_kept_per_span():
    m1 = root([1, 2, 3], [4, 5], log_probs=[-0.5, -0.5], facts={"policy_version": "3"})
    m2 = child(m1, [6], [7, 8, 9], log_probs=[-0.75, -1.5, -3.0], facts={"policy_version": "4"})
    out = rebuild(snapshot_of(m1, m2, finish=declared(m2, result={"reward": -1})))
    t = out.trajectory
    assert t.token_ids == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert list(t.loss_mask) == [0, 0, 0, 1, 1, 0, 1, 1, 1]
    assert t.log_probs == [-0.5, -0.5, -0.75, -1.5, -3.0]
    assert [(s.start, s.end, s.policy_version) for s in t.spans] == [(0, 5, "3"), (5, 9, "4")]


def test_json_forms_agree_and_always_carry_mask_sample():
    m1 = root([1, 2, 3], [4, 5])
    m2 = child(m1, [6], [7])
    for out in (rebuild(snapshot_of(m1, m2)), rebuild(snapshot_of(m1, incomplete("c" * 32)))):
        line = to_json_line(out)
        assert line.endswith(b"\n") and json.loads(line) == to_json_dict(out)
        assert "mask_sample" in json.loads(line)
        assert json.loads(to_json_line(out, include_response=False))["response"] is None
    capture = to_json_dict(rebuild(snapshot_of(m1, m2)))["_ng_token_capture"]
    for key in ("n_calls", "roots", "chains", "delivered_fraction", "quarantined_calls", "quarantined_fraction",
                "empty_generation_calls", "unresolved_parent_calls", "parent_link_failures",
                "generated_tokens_captured", "generated_tokens_delivered", "capture_incomplete",
                "side_calls_excluded", "terminal_attribution", "error"):
        assert key in capture
