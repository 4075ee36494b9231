"""Policy versions (schemas.policy_versions): the book's order and staleness, and the span builders."""

from __future__ import annotations

import pytest

from schemas.errors import ContractError
from schemas.policy_versions import (
    PolicyVersion,
    VersionBook,
    bracket_spans,
    engine_spans,
    merge_spans,
    observed_spans,
    part_spans,
    shifted,
)
from schemas.records import VersionSpan


def span(version: str, start: int, end: int) -> VersionSpan:
    return VersionSpan(version=version, start=start, end=end)


def test_the_book_orders_labels_by_step_and_never_moves_back():
    book = VersionBook([PolicyVersion("v2", 2), PolicyVersion("v1", 1)])
    assert book.current_label == "v2"  # a late, older announcement does not move the current version back
    assert book.step_of("v1") == 1 and book.step_of("default") == 0 and book.step_of("never") is None
    assert book.staleness(["v2"]) == 0 and book.staleness(["v1", "v2"]) == 1 and book.staleness(["default"]) == 2
    assert book.staleness(["never"]) is None and book.staleness([]) is None  # unknown is never guessed
    assert VersionBook().staleness(["v1"]) is None


@pytest.mark.parametrize(("label", "step"), [("", 1), ("v", -1), ("v", True), ("v", 1.5)])
def test_an_announcement_names_a_label_and_a_step(label, step):
    with pytest.raises(ContractError, match="label|step"):
        PolicyVersion(label, step)


def test_engine_spans_must_cover_the_generation_in_order():
    assert engine_spans([{"version": "a", "start": 0, "end": 2}, {"version": "a", "start": 2, "end": 5}], 5) == [
        span("a", 0, 5)]
    for bad, n, why in [([{"version": "a", "start": 0, "end": 4}], 5, "cover 4"),
                        ([{"version": "a", "start": 1, "end": 5}], 5, "continue at token 0"),
                        ([{"version": "", "start": 0, "end": 5}], 5, "non-empty"),
                        ({"version": "a"}, 5, "list"),
                        ([{"version": "a", "start": "0", "end": 5}], 5, "integers")]:
        with pytest.raises(ValueError, match=why):
            engine_spans(bad, n)


def test_observed_marks_split_where_the_version_changed():
    assert observed_spans([("v1", 0), ("v2", 3)], 7) == [span("v1", 0, 3), span("v2", 3, 7)]
    assert observed_spans([(None, 0), ("v2", 3)], 7) == [span("", 0, 3), span("v2", 3, 7)]
    assert observed_spans([(None, 0)], 7) == []  # nothing was ever announced
    assert observed_spans([("v1", 0), ("v2", 9)], 7) == [span("v1", 0, 7)]


def test_a_bracket_names_one_version_only_when_dispatch_and_completion_agree():
    assert bracket_spans("v1", "v1", 4) == [span("v1", 0, 4)]
    assert bracket_spans("v1", "v2", 4) == [span("", 0, 4)]
    assert bracket_spans(None, None, 4) == [] and bracket_spans("v1", "v1", 0) == []


def test_parts_of_a_continued_call_take_the_version_at_their_end():
    # Part 0 dispatched and aborted under v1; part 1 generated after the resume, under v2.
    assert part_spans("v1", [(3, "v1")], "v2", 8) == [span("v1", 0, 3), span("v2", 3, 8)]
    # The announcement came before the abort was seen: part 0 is bracketed (v1..v2), not guessed.
    assert part_spans("v1", [(3, "v2")], "v2", 8) == [span("", 0, 3), span("v2", 3, 8)]


def test_merge_and_shift():
    assert merge_spans([span("a", 0, 2), span("a", 2, 4), span("b", 4, 4), span("b", 4, 6)]) == [
        span("a", 0, 4), span("b", 4, 6)]
    assert shifted([span("a", 0, 2)], 10) == [span("a", 10, 12)]
