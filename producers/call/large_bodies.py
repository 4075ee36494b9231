"""Large request bodies: a capture's per-message work runs in a worker thread, so the event loop keeps serving.

Before dispatch a capture reads its request (the JSON parse and depth check, the dialect's checks and
translation: ``producers.call.generation.read_request``) and describes it (its items, facts, fingerprint
and context digests: ``CaptureCore.describe``). Both are linear in the request: ~0.1 s of CPU per MB of
short chat messages on the development machine. On the event loop, four 15 MB bodies stalled every other
request (``/healthz`` included) for seconds (issue 26; ``python -m compose.tools.large_bodies``).

Guarantees:

* A body of at most ``LARGE_BODY_BYTES`` takes the path it always took, on the loop: no thread hop, no
  copy, nothing counted. Only a larger one's steps are offloaded.
* An offloaded step runs the same function on the same arguments: the same result, the same exception
  (re-raised on the loop, so a bad large body gets the 400 a small one gets).
* While a step runs in the lane's thread, the loop waits for it without blocking. It is held only while
  that thread holds the GIL: at most the interpreter's switch interval (5 ms) in Python code, or one C
  call that does not release it; the longest is orjson's parse of the whole body (~6 ms per MB of
  short messages, ~0.1 s for 16 MiB).
* At most ``LARGE_BODIES_AT_ONCE`` steps run at once, in the lane's own thread (never the loop's
  default executor, which the spool's fsyncs use); the others wait their turn, in order, while the loop
  serves. A waiting step whose request is cancelled never runs. So preparing large bodies holds at
  most one body's transient memory, whatever their number; what a call keeps (its parsed request)
  lives as long as the call. The engine's deadlines start after the preparation, not before.
* A large call's parsed request is freed in the lane's thread when the call ends, and its upstream body is
  encoded there (``producers.call.dispatch.send_chat``). After the last large call in flight ends, what
  it left in reference cycles is collected and the C heap's free pages go back to the OS (glibc's
  ``malloc_trim``): RSS returns near where it was.

This module knows no HTTP framework; ``producers.call.generation`` decides which bodies come here.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from producers.capture import c_heap

__all__ = ["LARGE_BODIES_AT_ONCE", "LARGE_BODY_BYTES", "LargeBodies", "LargeCall", "freeze_startup_heap"]

T = TypeVar("T")

# Above this many bytes a request's preparation leaves the loop. Its cost is per message more than per
# byte: 1 MiB of 57-byte messages took ~85 ms on the loop, 1 MiB in one message ~8 ms (the tool's two
# shapes, 15 MB, scaled). An agent's ordinary call (up to a few hundred KB, mostly long tool outputs and
# file contents) stays below and keeps its single-threaded path, where a thread hop and the GIL
# contention it brings would cost more than they save.
LARGE_BODY_BYTES = 1 << 20
# Steps of large bodies run at once. They are CPU-bound Python under one GIL: a second thread adds no
# throughput, and each is one more contender for the GIL the loop needs (CPython hands it to any waiting
# thread): with two, /healthz's median under four 15 MB bodies was 12-16 ms, with one 6-7 ms. One also
# bounds the transient memory of parsing (15 MB of short messages parse into ~100 MB of objects).
LARGE_BODIES_AT_ONCE = 1


def freeze_startup_heap() -> int:
    """Move every object alive now into the collector's permanent generation; how many are frozen.

    For a process that is tokentrail's own (the proxy), once it has started: what exists then (modules,
    settings, clients, the codec) lives as long as the process, and a full collection walks it all for
    nothing. ``LargeBodies.release_memory`` runs one on the loop after large calls: ~60-75 ms of the
    proxy's startup heap (49k objects here) each time, the longest stall left in a burst of 15 MB bodies;
    frozen, it walks only what calls made since. Frozen objects are still freed by reference counting;
    only a cycle among them would never be collected, and the startup heap makes none worth that walk.
    Never called in vLLM's process (the middleware): its heap is not ours to freeze.
    """
    gc.collect()  # what startup left as garbage goes now, not into the permanent generation
    gc.freeze()
    return gc.get_freeze_count()


class LargeBodies:
    """The lane large bodies' preparation runs in: its threads, the count of steps it ran, memory release."""

    def __init__(self, workers: int = LARGE_BODIES_AT_ONCE) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tokentrail-large-body")
        self.offloaded = 0  # steps run in the lane's threads (tests count them)
        self.releases = 0  # memory releases run (``release_memory``)
        self._in_flight = 0  # large calls being handled
        self._trimming: Future[int] | None = None
        self._closed = False

    async def offload(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` run in one of the lane's threads, once one is free; its result, or its exception."""
        self.offloaded += 1
        # Cancelling the wrapper cancels a step that has not started; one that has runs to its end, in its
        # thread, so the lane never runs more than its workers.
        return await asyncio.wrap_future(self._pool.submit(fn, *args))

    def call(self) -> LargeCall:
        """A large call begins; ``LargeCall.ended`` when its handler is done."""
        self._in_flight += 1
        return LargeCall(self)

    def _ended(self, kept: list[Any]) -> None:
        if kept and not self._closed:
            self._pool.submit(kept.clear)  # the call's request is freed in the lane's thread
        self._in_flight -= 1
        if self._in_flight == 0:  # from the loop's next callback on: the handler's frames are gone
            asyncio.get_running_loop().call_soon(self.release_memory)

    def release_memory(self) -> None:
        """Free what large calls left in reference cycles, then hand the C heap's free pages to the OS.

        Cycles hold a call's bodies until the collector's next full pass, which a quiet interceptor may
        not run for a long time: httpx's request and response refer to each other (the request holds the
        upstream body), and so do a task and the exception that ended it (``ClientWatch``'s watcher,
        whose frame holds the request's ``receive`` and so its raw body). The collection runs here, on the
        loop's thread, because finalizers of what it frees (coroutines, futures) must; it walks every
        tracked object once, as the collector's own full passes do. The trim runs in the lane's thread
        (a CDLL call releases the GIL).
        """
        if self._in_flight or self._closed:
            return  # another large call started meanwhile: its end releases
        self.releases += 1
        gc.collect()
        if c_heap.AVAILABLE:
            self._trimming = self._pool.submit(c_heap.trim)

    async def close(self) -> None:
        """Stop the lane once a trim under way is done; steps that have not started are cancelled."""
        self._closed = True
        if self._trimming is not None:
            await asyncio.wrap_future(self._trimming)
        self._pool.shutdown(wait=False, cancel_futures=True)


class LargeCall:
    """One large call's steps in the lane. What they return (the parsed request, its description) is kept
    until the call ends, then let go in the lane's thread: freeing 15 MB of parsed short messages is one
    ~30 ms C call that holds the GIL, better not on the loop among the other calls' work."""

    __slots__ = ("_kept", "_lane")

    def __init__(self, lane: LargeBodies) -> None:
        self._lane = lane
        self._kept: list[Any] = []

    async def offload(self, fn: Callable[..., T], *args: Any) -> T:
        """``LargeBodies.offload``, its result kept until ``ended``."""
        result = await self._lane.offload(fn, *args)
        self._kept.append(result)
        return result

    def ended(self) -> None:
        """The call's handler is done (its frames gone): free what it kept; once no large call is left,
        ``release_memory``."""
        self._lane._ended(self._kept)
