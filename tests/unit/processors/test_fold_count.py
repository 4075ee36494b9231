"""The fold worker's "folded N events" log line: at most once a second, never more than a second behind."""

from __future__ import annotations

import asyncio
import logging

from processors.fold_loop import FoldCount


def _counts(caplog) -> list[int]:
    return [int(r.getMessage().split()[1]) for r in caplog.records if r.getMessage().startswith("folded ")]


async def test_a_count_under_a_second_old_is_logged_when_the_second_ends(caplog):
    caplog.set_level(logging.INFO, logger="tokentrail.processor")
    count = FoldCount()
    count._next = 0.0  # the first add logs at once
    count.add(3)
    count.add(2)  # within the second: not yet logged
    assert _counts(caplog) == [3]
    await asyncio.sleep(1.2)  # the worker went quiet: the 5 must still reach the log
    assert _counts(caplog) == [3, 5]
    await asyncio.sleep(1.2)  # nothing new folded: no repeated line
    assert _counts(caplog) == [3, 5]


def test_without_an_event_loop_the_count_waits_for_the_next_add(caplog):
    caplog.set_level(logging.INFO, logger="tokentrail.processor")
    count = FoldCount()
    count.add(1)
    assert _counts(caplog) == []
    count.log()
    assert _counts(caplog) == [1]
