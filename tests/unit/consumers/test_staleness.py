"""The max_staleness rule (consumers.rebuild.staleness) over rebuilt rollouts and a version book."""

from __future__ import annotations

import json

import pytest

from consumers.rebuild import RebuildRules, rebuild
from consumers.rebuild.output import to_json_dict
from consumers.rebuild.staleness import apply_staleness, check_staleness, rollout_staleness
from schemas.policy_versions import PolicyVersion, VersionBook
from schemas.records import MaskCode, VersionSpan
from tests.factories import incomplete
from tests.unit.consumers.support import child, declared, root, snapshot_of

K = 2


def book(current: int, *extra: tuple[str, int]) -> VersionBook:
    """v0..v<current> announced at steps 0..current (the last is current), plus ``extra``."""
    return VersionBook([*(PolicyVersion(label=f"v{s}", step=s) for s in range(current + 1)),
                        *(PolicyVersion(label=label, step=step) for label, step in extra)])


def spans(*runs: tuple[str, int]) -> list[VersionSpan]:
    out, at = [], 0
    for version, n in runs:
        out.append(VersionSpan(version=version, start=at, end=at + n))
        at += n
    return out


def versioned(prompt, gen, *runs, parent=None, dispatch=None, **kw):
    facts = {"version_spans": spans(*runs) if runs else [], "version_spans_source": "observed" if runs else "",
             "dispatch_version": dispatch}
    if parent is not None:
        return child(parent, prompt, gen, facts=facts, **kw)
    return root(prompt, gen, facts=facts, **kw)


def two_calls(first: str, second: str, **rules):
    """r (3 generated tokens of ``first``) -> c (2 of ``second``), c declared terminal."""
    r = versioned([1, 2], [3, 4, 5], (first, 3))
    c = versioned([6], [7, 8], (second, 2), parent=r)
    return rebuild(snapshot_of(r, c, finish=declared(c)), RebuildRules(**rules)), r, c


def codes(rollout) -> list[str]:
    return [r.code for r in rollout.mask_reasons]


def capture(rollout) -> dict:
    return to_json_dict(rollout, include_response=False)["_ng_token_capture"]


@pytest.mark.parametrize("staleness", range(K + 3))
def test_exactly_the_rollouts_more_than_k_behind_are_masked_stale_policy(staleness):
    rolled, r, _ = two_calls("v3", f"v{3 + staleness}")  # the oldest token is v3, the newest current
    b = book(3 + staleness)
    assert rollout_staleness(rolled, b) == (staleness, "v3", "")
    out = apply_staleness(rolled, b, K)
    info = capture(out)
    assert (info["policy_staleness"], info["oldest_policy_version"], info["current_policy_version"]) == (
        staleness, "v3", f"v{3 + staleness}")
    if staleness <= K:
        assert not out.mask_sample and out.mask_reasons == []
        return
    assert out.mask_sample and codes(out) == [MaskCode.STALE_POLICY]
    (reason,) = out.mask_reasons
    assert reason.call_ids == [r.model_call_id]  # the call holding the oldest version
    assert f"staleness {staleness} > max_staleness={K}" in reason.detail
    assert "'v3'" in reason.detail and f"'v{3 + staleness}'" in reason.detail


def test_without_max_staleness_the_staleness_is_reported_and_nothing_masked():
    rolled, _, _ = two_calls("v0", "v1")
    out = apply_staleness(rolled, book(9), None)
    assert not out.mask_sample and capture(out)["policy_staleness"] == 9
    assert out.trajectory == rolled.trajectory  # only the metrics' detail changed


def test_a_label_never_announced_masks_unknown_policy_version_never_guessed():
    rolled, _, c = two_calls("v1", "mystery")
    assert rollout_staleness(rolled, book(1)) == (None, None, "version(s) ['mystery'] were never announced on "
                                                                 "the versions topic")
    out = apply_staleness(rolled, book(1), K, "drop")  # unknown is masked, never dropped
    assert codes(out) == [MaskCode.UNKNOWN_POLICY_VERSION] and out.mask_reasons[0].call_ids == [c.model_call_id]
    assert "max_staleness=2 cannot be checked" in out.mask_reasons[0].detail
    info = capture(out)
    assert info["policy_staleness"] is None and "mystery" in info["policy_staleness_unknown"]
    assert not apply_staleness(rolled, book(1), None).mask_sample  # reported only, without the rule


def test_an_unknown_span_counts_as_the_calls_dispatch_version():
    r = versioned([1, 2], [3, 4, 5], ("v4", 1), ("", 2), dispatch="v1")  # bracketed across an update
    rolled = rebuild(snapshot_of(r, finish=declared(r)), RebuildRules())
    assert rollout_staleness(rolled, book(4)) == (3, "v1", "")
    # The rebuild masked it already (an unknown span always masks); the rule adds its own verdict.
    assert codes(apply_staleness(rolled, book(4), K)) == [MaskCode.UNKNOWN_POLICY_VERSION, MaskCode.STALE_POLICY]
    closer = VersionBook([PolicyVersion(label="v1", step=1), PolicyVersion(label="v4", step=3)])
    assert codes(apply_staleness(rolled, closer, K)) == [MaskCode.UNKNOWN_POLICY_VERSION]  # 2 behind: within K


def test_an_unknown_span_of_loss_bearing_tokens_masks_without_any_staleness_rule():
    """Issue 25: a token is labelled with the version that sampled it, or the rollout is masked."""
    bracketed = rebuild(snapshot_of(r := versioned([1, 2], [3, 4, 5], ("v4", 1), ("", 2), dispatch="v1"),
                                    finish=declared(r)), RebuildRules())
    assert bracketed.mask_sample and codes(bracketed) == [MaskCode.UNKNOWN_POLICY_VERSION]
    (reason,) = bracketed.mask_reasons
    assert "tokens [3, 5)" in reason.detail and reason.call_ids  # trajectory positions: 2 prompt ids first
    known = rebuild(snapshot_of(r := versioned([1, 2], [3, 4, 5], ("v4", 1), ("v5", 2), dispatch="v4"),
                                finish=declared(r)), RebuildRules())
    assert not known.mask_sample, known.mask_reasons


def test_an_unknown_span_without_a_dispatch_version_is_unknown():
    r = versioned([1, 2], [3, 4], ("", 2))
    rolled = rebuild(snapshot_of(r, finish=declared(r)), RebuildRules())
    assert rollout_staleness(rolled, book(1))[0] is None
    assert codes(rolled) == [MaskCode.UNKNOWN_POLICY_VERSION]  # the rebuild's; then the rule's
    assert codes(apply_staleness(rolled, book(1), K)) == [MaskCode.UNKNOWN_POLICY_VERSION] * 2


def test_generated_tokens_without_any_version_mask_unknown_under_the_rule():
    r = versioned([1, 2], [3, 4])
    rolled = rebuild(snapshot_of(r, finish=declared(r)), RebuildRules())
    assert codes(apply_staleness(rolled, book(1), 0)) == [MaskCode.UNKNOWN_POLICY_VERSION]
    empty = VersionBook()  # nothing announced: even a named version has no staleness
    rolled2, _, _ = two_calls("v0", "v0")
    check = check_staleness(rolled2, empty)
    assert check.staleness is None and "no policy version was announced" in check.why
    assert codes(apply_staleness(rolled2, empty, 5)) == [MaskCode.UNKNOWN_POLICY_VERSION]


def test_a_rollout_without_generated_tokens_is_never_masked_for_staleness():
    snap = snapshot_of()  # no calls at all: masked for that, not for versions
    rolled = rebuild(snap, RebuildRules())
    out = apply_staleness(rolled, book(5), 0, "drop")
    assert codes(out) == codes(rolled) and capture(out)["policy_staleness"] is None
    assert "policy_staleness_unknown" not in capture(out)


def test_drop_returns_none_for_a_stale_rollout_only():
    stale, _, _ = two_calls("v0", "v3")
    assert apply_staleness(stale, book(3), K, "drop") is None
    rolled, _, _ = two_calls("v1", "v3")
    kept = apply_staleness(rolled, book(3), K, "drop")
    assert kept is not None and not kept.mask_sample
    with pytest.raises(ValueError, match="stale_action='skip'"):
        apply_staleness(rolled, book(2), K, "skip")  # type: ignore[arg-type]


def test_a_stale_reason_is_added_after_the_rollouts_own_reasons():
    r = versioned([1, 2], [3], ("v0", 1))
    rolled = rebuild(snapshot_of(r, incomplete("a" * 32), finish=declared(r)), RebuildRules())
    assert codes(rolled) == [MaskCode.CAPTURE_INCOMPLETE] and rolled.trajectory is not None
    out = apply_staleness(rolled, book(5), K)
    assert codes(out) == [MaskCode.CAPTURE_INCOMPLETE, MaskCode.STALE_POLICY]


def test_traces_mode_judges_every_traces_tokens_not_only_the_terminal_chain():
    m1 = versioned([1, 2, 3], [4, 5], ("v3", 2))
    m2 = versioned([6], [7], ("v3", 1), parent=m1)
    fork = versioned([20, 21], [22, 23], ("v0", 2), parent=m1)  # an abandoned branch of old weights
    snap = snapshot_of(m1, m2, fork, finish=declared(m2))
    terminal = rebuild(snap, RebuildRules())
    traced = rebuild(snap, RebuildRules(delivery_mode="traces"))
    assert not traced.mask_sample and len(traced.traces) == 2
    assert rollout_staleness(terminal, book(3)) == (0, "v3", "")  # the fork is not delivered there
    assert rollout_staleness(traced, book(3)) == (3, "v0", "")  # it is a trace here
    out = apply_staleness(traced, book(3), K)
    assert codes(out) == [MaskCode.STALE_POLICY] and out.mask_reasons[0].call_ids == [fork.model_call_id]
    assert not apply_staleness(terminal, book(3), K).mask_sample


def test_the_record_stays_deterministic_json():
    rolled, _, _ = two_calls("v1", "v2")
    a = apply_staleness(rolled, book(4), K)
    b = apply_staleness(rolled, book(4), K)
    assert a == b
    detail = json.loads(a.metrics.detail_json)
    assert list(detail) == sorted(detail)
