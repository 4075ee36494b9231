"""Engine-wide state the RL control routes change: the weight version label, and pause/resume.

Weight versions are opaque labels, as in vLLM (``"default"`` until a trainer names one,
then whatever ``POST /update_weight_version {"new_version": str}`` set). The model table
needs an integer, so ``version_key`` maps a label to one: ``"default"`` is 0, a decimal
label is its integer (``"7"`` is 7, so the old integer admin route keeps its tables), any
other label a stable 31-bit hash.

Pause follows ``POST /pause?mode=abort|wait|keep`` (``vllm/entrypoints/rl/online/api_router.py``):

* ``abort`` (vLLM's default): every generation in flight, or waiting to start, ends now
  with finish_reason ``"abort"`` and the tokens generated so far;
* ``wait``: the call returns once the generations in flight have finished;
* ``keep``: generations in flight freeze where they are and go on after ``/resume``, under
  the weight version current then (an update while frozen splits their ``weight_versions``
  at the first token generated after the resume: ``PolicyEngine.at_token``).

While paused, new generations wait (vLLM queues them) until ``POST /resume``. A
generation is "in flight" while its tokens are being delivered: with
``decode_ms_per_token`` > 0, or a stalled stream; an instant generation cannot be caught.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from compose.engines.policy.settings import DEFAULT_WEIGHT_VERSION

PAUSE_MODES = ("abort", "wait", "keep")


def version_key(label: str | int) -> int:
    """The model-table version of a weight version label (see the module docstring)."""
    if isinstance(label, int) and not isinstance(label, bool):
        return label
    assert isinstance(label, str)  # a bool is no label
    if label == DEFAULT_WEIGHT_VERSION:
        return 0
    if label.isascii() and label.isdigit() and int(label) < 2**31:
        return int(label)
    return int.from_bytes(hashlib.blake2b(label.encode(), digest_size=4).digest(), "big") & 0x7FFFFFFF


class Flight:
    """One generation being delivered; ``step`` paces it and says whether it may go on."""

    def __init__(self, control: EngineControl, request_id: str | None = None) -> None:
        self.control = control
        self.request_id = request_id
        self.aborted = False
        self.admitted = False
        self.done = asyncio.Event()
        self._abort = asyncio.Event()
        self._due = 0.0  # when the next paced token is due (event loop time)

    def abort(self) -> None:
        self.aborted = True
        self._abort.set()

    async def admit(self) -> bool:
        """Wait while the engine is paused; False when aborted before the first token."""
        await self._until(lambda: not self.control.paused)
        self.admitted = not self.aborted
        return self.admitted

    async def step(self, ms_per_token: float) -> bool:
        """Before each token: freeze while paused in keep mode, pace, and report an abort."""
        if self.aborted:
            return False
        loop = asyncio.get_running_loop()
        if self.control.frozen:
            await self._until(lambda: not self.control.frozen)
            self._due = loop.time()  # the pace starts again at the resume: no burst of frozen tokens
        if ms_per_token and not self.aborted:
            # Paced against a schedule, as a GPU keeps generating while its server is busy: a token late
            # because the event loop was busy shortens the next wait instead of delaying every later token
            # (sleeping ms_per_token after each token added every timer's lateness: 512 tokens at 5 ms took
            # ~3.9 s, not 2.6, at 64 concurrent generations). An abort lands at the next token, as vLLM's
            # at its next step.
            now = loop.time()
            self._due = (self._due or now) + ms_per_token / 1000
            if self._due > now:
                await asyncio.sleep(self._due - now)
        return not self.aborted

    async def hang(self, seconds: float | None) -> bool:
        """A stalled stream: wait until aborted (True) or ``seconds`` pass (False)."""
        try:
            await asyncio.wait_for(self._abort.wait(), seconds)
        except TimeoutError:
            return False
        return True

    async def _until(self, ready) -> None:
        while not ready() and not self.aborted:
            changed = asyncio.ensure_future(self.control.changed.wait())
            aborted = asyncio.ensure_future(self._abort.wait())
            try:
                await asyncio.wait({changed, aborted}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                changed.cancel()
                aborted.cancel()


class EngineControl:
    """The server's weight label, pause state and generations in flight (one event loop)."""

    def __init__(self, weight_version: str = DEFAULT_WEIGHT_VERSION) -> None:
        self.weight_version = weight_version
        self.paused = False
        self.mode: str | None = None
        self.flights: set[Flight] = set()
        self._changed: asyncio.Event | None = None

    @property
    def changed(self) -> asyncio.Event:
        if self._changed is None:  # created lazily: the settings object is built outside any loop
            self._changed = asyncio.Event()
        return self._changed

    @property
    def frozen(self) -> bool:
        return self.paused and self.mode == "keep"

    def _notify(self) -> None:
        self.changed.set()
        self._changed = None  # waiters hold the old (set) event; new waiters get a fresh one

    @asynccontextmanager
    async def flight(self, request_id: str | None = None) -> AsyncIterator[Flight]:
        flight = Flight(self, request_id)
        self.flights.add(flight)
        try:
            yield flight
        finally:
            self.flights.discard(flight)
            flight.done.set()

    async def pause(self, mode: str) -> None:
        self.paused, self.mode = True, mode
        if mode == "abort":
            for flight in list(self.flights):
                flight.abort()
        self._notify()
        if mode == "wait":
            running = [f.done.wait() for f in list(self.flights) if f.admitted]
            if running:
                await asyncio.gather(*running)
        await asyncio.sleep(0.02)  # like vLLM: let the aborted outputs go out before answering

    def resume(self) -> None:
        self.paused, self.mode = False, None
        self._notify()
