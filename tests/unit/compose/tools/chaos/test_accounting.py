"""The chaos accounting: each of the four counts fires for what it names, and only for that."""

from __future__ import annotations

import copy
from typing import Any

from compose.tools.chaos.accounting import COUNTS, Outcome, Row, account, canonical, failing, render, total

A, B, C = "a" * 32, "b" * 32, "c" * 32  # model call ids (uuid4 hex)
X, Y = "d" * 32, "e" * 32  # the same calls, minted again in another run


def _record(rollout_id: str, calls: list[str], *, masked: bool = False, snapshot: str = "f" * 32,
            log_probs: list[float] | None = None, version: int = 5) -> dict[str, Any]:
    return {
        "rollout_id": rollout_id, "snapshot_id": snapshot, "version": version, "mask_sample": masked,
        "mask_reasons": [{"code": "intent_without_capture", "detail": "", "call_ids": calls[-1:]}] if masked else [],
        "trajectory": {"token_ids": [1, 2, 3, 4], "loss_mask": [0, 1, 0, 1], "log_probs": log_probs or [-0.5, -1.25],
                       "prompt_len": 1, "spans": [{"model_call_id": c, "start": 2 * i, "generation_start": 2 * i + 1,
                                                   "end": 2 * i + 2, "policy_version": None}
                                                  for i, c in enumerate(calls)]},
        "response": {"id": f"proj-{rollout_id}", "output": [{"id": f"chatcmpl-tt{c}"} for c in calls]},
        "result": {"reward": 1.0, "task": 0},
        "_ng_token_capture": {"n_calls": len(calls), "delivered_call_ids": list(calls),
                              "terminal": {"declared_call_id": calls[-1]}},
    }


BASELINE = {0: canonical(_record("run1-clean-0", [X, Y], snapshot="9" * 32))}


def _outcome(records: list[dict[str, Any]] | None = None, **kw: Any) -> Outcome:
    fields: dict[str, Any] = dict(index=0, rollout_id="run1-fault-0", acked=(A, B), failure=None,
                                  records=tuple(records if records is not None else [_record("run1-fault-0", [A, B])]),
                                  captured={A: 1, B: 1})
    fields.update(kw)
    return Outcome(**fields)


def _counts(row: Row) -> dict[str, int]:
    return {c: getattr(row, c) for c in COUNTS}


ZERO = dict.fromkeys(COUNTS, 0)


def test_a_clean_rollout_equal_to_the_baseline_counts_nothing():
    row = account("f", [_outcome()], BASELINE)
    assert _counts(row) == ZERO and not failing([row])
    assert (row.rollouts, row.acked, row.fault_hit) == (1, 2, 0)


def test_canonical_ignores_only_rollout_snapshot_and_call_ids():
    one = _record("run1-clean-0", [X, Y], snapshot="1" * 32)
    two = _record("run2-broker-7", [A, B], snapshot="2" * 32)
    assert canonical(one) == canonical(two)
    assert "<rollout>" in canonical(two) and A not in canonical(two)
    # everything else counts: a log-prob one ulp off, the version, a swapped call order
    assert canonical(_record("r", [A, B], log_probs=[-0.5, -1.2500000000000002])) != canonical(_record("r", [A, B]))
    assert canonical(_record("r", [A, B], version=6)) != canonical(_record("r", [A, B]))
    swapped = _record("r", [A, B])
    swapped["_ng_token_capture"]["terminal"]["declared_call_id"] = A
    assert canonical(swapped) != canonical(_record("r", [A, B]))


def test_an_acknowledged_call_missing_from_the_log_is_lost():
    row = account("f", [_outcome(captured={A: 1})], BASELINE)
    assert row.lost == 1 and failing([row])
    assert any(B in p and "no CallCaptured" in p for p in row.problems)


def test_every_acknowledged_call_of_an_undelivered_rollout_is_lost_and_the_record_differs():
    row = account("f", [_outcome(records=[])], BASELINE)
    assert (row.lost, row.differs) == (2, 1)


def test_a_rollout_delivered_twice_is_a_duplicate():
    first = _record("run1-fault-0", [A, B])
    second = _record("run1-fault-0", [A, B], snapshot="3" * 32, version=6)
    row = account("f", [_outcome(records=[first, second])], BASELINE)
    assert row.duplicated == 1


def test_a_call_captured_twice_on_the_log_is_a_duplicate():
    row = account("f", [_outcome(captured={A: 2, B: 1})], BASELINE)
    assert _counts(row) == {**ZERO, "duplicated": 1}


def test_a_call_twice_in_the_trajectory_is_a_duplicate():
    row = account("f", [_outcome(records=[_record("run1-fault-0", [A, B, B])])], BASELINE)
    assert row.duplicated == 1


def test_a_dangling_intent_under_an_unmasked_record_is_an_unmasked_lost_call():
    outcome = _outcome(started=frozenset({A, B, C}), failed_attempts=1)  # C was dispatched, never captured
    row = account("f", [outcome], BASELINE)
    assert row.unmasked_lost == 1 and row.fault_hit == 1
    assert any(C in p for p in row.problems)


def test_an_intent_closed_by_an_incomplete_marker_is_not_dangling():
    outcome = _outcome(started=frozenset({A, B, C}), incomplete=frozenset({C}))
    assert outcome.dangling() == []


def test_an_acknowledged_call_missing_from_an_unmasked_trajectory_is_an_unmasked_lost_call():
    row = account("f", [_outcome(records=[_record("run1-fault-0", [A])])], BASELINE)
    assert row.unmasked_lost == 1 and row.differs == 1


def test_a_harness_that_gave_up_on_a_call_must_be_masked():
    unmasked = account("f", [_outcome(failure="deadline passed")], BASELINE)
    assert unmasked.unmasked_lost == 1
    masked = account("f", [_outcome(failure="deadline passed",
                                    records=[_record("run1-fault-0", [A, B], masked=True)])], BASELINE)
    assert _counts(masked) == ZERO and masked.masked_as_expected == 1


def test_a_hit_rollout_may_be_masked_with_a_reason_but_not_without_one():
    masked = _record("run1-fault-0", [A, B], masked=True)
    ok = account("f", [_outcome(records=[masked], started=frozenset({A, B, C}), failed_attempts=1)], BASELINE)
    assert _counts(ok) == ZERO and ok.masked_as_expected == 1
    no_reason = copy.deepcopy(masked)
    no_reason["mask_reasons"] = []
    bad = account("f", [_outcome(records=[no_reason], started=frozenset({A, B, C}), failed_attempts=1)], BASELINE)
    assert bad.differs == 1


def test_a_hit_rollout_whose_retries_left_nothing_must_equal_the_baseline():
    recovered = account("f", [_outcome(failed_attempts=3)], BASELINE)
    assert _counts(recovered) == ZERO and recovered.fault_hit == 1
    other = _record("run1-fault-0", [A, B], log_probs=[-0.5, -1.0])
    drifted = account("f", [_outcome(records=[other], failed_attempts=3)], BASELINE)
    assert drifted.differs == 1


def test_a_retried_attempt_recorded_incomplete_may_leave_only_its_evidence_in_an_unmasked_record():
    # The engine aborted an attempt (CallIncomplete), the harness retried it: the same trajectory, two more
    # events folded, and the capture says a call of it was incomplete.
    retried = _record("run1-fault-0", [A, B], version=7)
    retried["_ng_token_capture"]["capture_incomplete"] = True
    clean = _record("run1-clean-0", [X, Y], snapshot="9" * 32)
    clean["_ng_token_capture"]["capture_incomplete"] = False
    baseline = {0: canonical(clean)}
    started, incomplete = frozenset({A, B, C}), frozenset({C})
    ok = account("f", [_outcome(records=[retried], started=started, incomplete=incomplete, failed_attempts=1)],
                 baseline)
    assert _counts(ok) == ZERO and ok.fault_hit == 1
    # Only for a rollout the fault hit, and only that evidence: a changed log-prob still differs.
    not_hit = account("f", [_outcome(records=[retried], started=started, incomplete=incomplete)], baseline)
    assert not_hit.differs == 1
    drifted = copy.deepcopy(retried)
    drifted["trajectory"]["log_probs"] = [-0.5, -1.0]
    bad = account("f", [_outcome(records=[drifted], started=started, incomplete=incomplete, failed_attempts=1)],
                  baseline)
    assert bad.differs == 1


def test_an_unknown_dispatch_version_passes_only_where_the_fault_left_the_versions_unreadable():
    labelled = _record("run1-clean-0", [X, Y], snapshot="9" * 32)
    for span in labelled["trajectory"]["spans"]:
        span["dispatch_version"] = "v3"
    baseline = {0: canonical(labelled)}
    unknown = _record("run1-fault-0", [A, B])
    unknown["trajectory"]["spans"][0]["dispatch_version"] = "v3"
    unknown["trajectory"]["spans"][1]["dispatch_version"] = None  # dispatched before it could read the topic
    assert _counts(account("f", [_outcome(records=[unknown])], baseline, versions_unreadable=True)) == ZERO
    assert account("f", [_outcome(records=[unknown])], baseline).differs == 1  # any other fault: it differs
    wrong = copy.deepcopy(unknown)
    wrong["trajectory"]["spans"][1]["dispatch_version"] = "v2"  # a wrong label is never excused
    assert account("f", [_outcome(records=[wrong])], baseline, versions_unreadable=True).differs == 1


def test_a_rollout_not_hit_but_masked_differs():
    row = account("f", [_outcome(records=[_record("run1-fault-0", [A, B], masked=True)])], BASELINE)
    assert _counts(row) == {**ZERO, "differs": 1}


def test_total_sums_every_count_and_the_table_shows_them():
    rows = [account("(a) one", [_outcome(captured={A: 1})], BASELINE), account("(b) two", [_outcome()], BASELINE)]
    summed = total(rows)
    assert (summed.rollouts, summed.acked, summed.lost) == (2, 4, 1)
    table = render(rows)
    total_line = next(line for line in table.splitlines() if line.startswith("total"))
    assert total_line.split()[1:] == ["2", "4", "0", "0", "1", "0", "0", "0"]
    assert "1 problem(s):" in table and failing(rows)
    assert not failing(rows[1:])
