"""The engine-abort fault: an abort that found nothing in flight did not happen, so it is tried again."""

from __future__ import annotations

from types import SimpleNamespace

from compose.tools.chaos import faults
from compose.tools.chaos.workload import Progress


async def _run(monkeypatch, fails_per_abort: list[int], expected_rollouts: int = 8):
    progress = Progress()
    aborts: list[str] = []

    async def mid_generation(ctx):
        return progress.acked, 1

    async def pause_engine(ctx, mode, hold_s):
        aborts.append(mode)
        progress.failed += fails_per_abort[len(aborts) - 1]  # what the harnesses saw of this abort

    monkeypatch.setattr(faults, "_mid_generation", mid_generation)
    monkeypatch.setattr(faults, "_pause_engine", pause_engine)
    ctx = SimpleNamespace(progress=progress, expected_rollouts=expected_rollouts)
    return await faults.abort_engine(ctx), aborts  # type: ignore[arg-type]


async def test_an_abort_that_failed_no_attempt_is_tried_at_the_next_stream(monkeypatch):
    said, aborts = await _run(monkeypatch, [0, 2, 5])
    assert aborts == ["abort", "abort"] and "try 2" in said


async def test_one_abort_that_hit_is_the_fault(monkeypatch):
    said, aborts = await _run(monkeypatch, [1, 1, 1])
    assert aborts == ["abort"] and "try" not in said


async def test_the_tries_are_bounded(monkeypatch):
    said, aborts = await _run(monkeypatch, [0] * 10)
    assert len(aborts) == faults.ABORT_TRIES and f"try {faults.ABORT_TRIES}" in said
