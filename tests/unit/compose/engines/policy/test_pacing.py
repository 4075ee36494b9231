"""The stand-in's emulated decode time: a schedule that late timers do not stretch, few timers per call.

Deterministic: the event loop's clock is replaced by one the test moves, and ``asyncio.sleep`` by a
recorder that advances it, so no assertion depends on this machine's speed.
"""

from __future__ import annotations

import asyncio

import pytest

import compose.engines.policy.control as control_module
import compose.engines.policy.server as server_module
from compose.engines.policy.control import EngineControl


class Clock:
    """The loop's ``time()``; ``sleep`` records each wait and moves the clock by it, plus ``late`` once."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []
        self.late = 0.0

    async def sleep(self, seconds: float) -> None:
        self.slept.append(round(seconds * 1000, 6))
        self.now += seconds + self.late
        self.late = 0.0


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()  # its own: another test may have closed or unset the current one
    yield loop
    loop.close()


@pytest.fixture
def clock(monkeypatch, loop):
    clock = Clock()
    monkeypatch.setattr(control_module.asyncio, "sleep", clock.sleep)
    monkeypatch.setattr(loop, "time", lambda: clock.now)
    return clock


def test_a_late_token_shortens_the_next_waits_instead_of_delaying_every_later_token(clock, loop):
    async def run() -> None:
        async with EngineControl().flight() as flight:
            assert await flight.step(5)
            clock.late = 0.012  # the loop was busy: this wait ended 12 ms late
            assert await flight.step(5)
            for _ in range(3):
                assert await flight.step(5)

    loop.run_until_complete(run())
    # 5, 5 (+12 late), then tokens 3 and 4 are already due (no wait), token 5 waits the remaining 3 ms
    assert clock.slept == [5.0, 5.0, 3.0]
    assert clock.now == pytest.approx(100.025)  # five tokens at 5 ms: on schedule again


def test_after_a_freeze_the_pace_starts_again_at_the_resume(clock, loop):
    control = EngineControl()

    async def run() -> None:
        async with control.flight() as flight:
            assert await flight.step(5)
            control.paused, control.mode = True, "keep"  # frozen between two tokens

            def resume() -> None:  # runs once the flight waits on the freeze
                clock.now += 1.0  # a second frozen
                control.resume()

            asyncio.get_running_loop().call_soon(resume)
            assert await flight.step(5)
            assert await flight.step(5)

    loop.run_until_complete(run())
    assert clock.slept == [5.0, 5.0, 5.0]  # a token time after the resume: no burst of the frozen second's tokens


def test_a_non_streamed_generation_arms_one_timer_per_pacing_step_not_per_token(loop):
    steps: list[float] = []

    class Flight:
        async def admit(self) -> bool:
            return True

        async def step(self, ms: float) -> bool:
            steps.append(ms)
            return True

    class Engine:
        control = EngineControl()

        def at_token(self, job, gens, t):
            return gens

    class Gen:
        token_ids = list(range(512))

    gens, produced = loop.run_until_complete(server_module._decode(Engine(), None, Flight(), [Gen()], 5.0))
    assert produced == 512
    per_step = int(server_module.PACING_STEP_S * 1000 / 5.0)
    assert len(steps) == -(-512 // per_step) and sum(steps) == pytest.approx(512 * 5.0)
