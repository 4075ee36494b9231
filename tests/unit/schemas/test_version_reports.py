"""The announcer's wait for interceptors (schemas.version_reports), on a fake clock: who is live, who confirmed.

An announcement returns only once every live interceptor applied it; one that stops reporting during
the wait is named, not waited out; one gone before the announcement (its lease over) is not waited
for; a clean stop (tombstone) drops out at once.
"""

from __future__ import annotations

import pytest

from schemas.errors import ContractError
from schemas.version_reports import AppliedReport, Confirmations, decode_report, encode_report

NOW = 1_000_000.0


def report(instance: str, step: int | None, at: float = NOW, lease_s: float = 5.0) -> AppliedReport:
    return AppliedReport(instance=instance, step=step, label=None if step is None else f"v{step}", at=at,
                         lease_s=lease_s)


def test_a_report_round_trips_and_bad_ones_name_the_field():
    r = report("interceptor@h:1#ab", 7)
    assert decode_report(encode_report(r)) == r
    with pytest.raises(ContractError, match="step=-1"):
        report("a", -1)
    with pytest.raises(ContractError, match="instance=''"):
        report("", 1)
    with pytest.raises(ContractError, match="kind='other'"):
        decode_report(b'{"kind": "other"}')
    with pytest.raises(ContractError, match="not JSON"):
        decode_report(b"\x00junk")
    with pytest.raises(ContractError, match="'at'"):
        decode_report(b'{"kind": "tokentrail.applied-version/1", "instance": "a", "step": 1}')


def test_done_only_once_every_live_interceptor_applied_the_step():
    c = Confirmations(7, skew_s=2.0)
    c.note(report("a", 6), NOW)
    c.note(report("b", 6), NOW)
    assert not c.done()  # not settled: the topic was not read to its end yet
    c.settle(NOW)
    assert c.missing() == ["a", "b"] and not c.done()
    c.note(report("a", 7, at=NOW + 0.01), NOW + 0.01)
    assert c.missing() == ["b"] and not c.done()
    c.note(report("b", 8, at=NOW + 0.02), NOW + 0.02)  # a later step counts: it applied 7 too
    assert c.done() and c.confirmed() == ["a", "b"]


def test_an_interceptor_whose_lease_ran_out_before_the_announcement_is_not_waited_for():
    c = Confirmations(7, skew_s=2.0)
    c.note(report("gone", 6, at=NOW - 7.5), NOW)  # 5 s lease + 2 s skew: no longer trusts its label
    c.note(report("edge", 6, at=NOW - 6.9), NOW)  # still may: it is waited for
    c.settle(NOW)
    assert c.missing() == ["edge"]


def test_an_interceptor_that_dies_during_the_wait_is_named_with_its_last_report():
    c = Confirmations(7, skew_s=2.0)
    c.note(report("alive", 6), NOW)
    c.note(report("dead", 6), NOW)
    c.settle(NOW)
    c.note(report("alive", 7, at=NOW + 0.05), NOW + 0.05)
    later = NOW + 30  # far past its lease: it is still named, never silently dropped
    assert c.missing() == ["dead"] and not c.done()
    why = c.explain(later, 30.0)
    assert "dead (last report 30.0 s ago, applied step 6 ('v6')" in why and "alive" not in why.split(":", 1)[1]
    assert "1 of 2 live interceptor(s)" in why


def test_one_that_starts_during_the_wait_must_confirm_too_and_a_clean_stop_drops_out():
    c = Confirmations(3)
    c.settle(NOW)
    assert c.done()  # nobody follows the topic: nothing to wait for
    c.note(report("new", 2, at=NOW + 1), NOW + 1)
    assert c.missing() == ["new"]
    c.gone("new")  # its tombstone
    assert c.done()


def test_min_followers_counts_confirmed_interceptors():
    c = Confirmations(1, min_followers=2)
    c.note(report("a", 1), NOW)
    c.settle(NOW)
    assert not c.done() and "min_followers=2" in c.explain(NOW, 1.0)
    c.note(report("b", 1), NOW)
    assert c.done()


def test_an_out_of_order_older_report_does_not_undo_a_confirmation():
    c = Confirmations(5)
    c.note(report("a", 5, at=NOW), NOW)
    c.note(report("a", 4, at=NOW - 1), NOW)
    c.settle(NOW)
    assert c.done()


@pytest.mark.parametrize(("kw", "field"), [({"step": -1}, "step=-1"), ({"step": 1, "min_followers": -1}, "min_followers"),
                                           ({"step": 1, "skew_s": float("nan")}, "skew_s")])
def test_invalid_wait_arguments_name_the_field(kw, field):
    step = kw.pop("step")
    with pytest.raises(ContractError, match=field):
        Confirmations(step, **kw)
