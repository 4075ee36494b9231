"""The interceptor's side of the policy-versions protocol: follow, apply, report, keep the lease.

``follow`` starts a ``schemas.kafka.versions.VersionFollower`` that reports as this interceptor's
instance (``instance_id``) and wires it to the ``VersionClock`` on the event loop (started later, in the
background, when the broker cannot be read at startup: ``_Retrying``):

* an announcement read by the follower's thread is applied on the loop (``clock.announce``), and
  right after it, on the loop, ``follower.applied(step)`` publishes the report the announcer
  waits for: a report always follows the clock, never precedes it;
* ``on_fresh(until)`` (a report acknowledged, then the topic read to its end) renews the clock's
  lease on the loop, after every announcement read before it was applied (the loop runs callbacks
  in the order they were scheduled), and a timer expires it at ``until`` unless renewed.

Nothing here runs per call: a call reads ``clock.label`` as before (``schemas.version_reports``
explains why the lease makes that label never older than the engine's).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

from producers.capture.events import default_source
from producers.capture.version_clock import VersionClock
from producers.settings import InterceptorSettings
from schemas.errors import TransportError

__all__ = ["follow", "instance_id"]

log = logging.getLogger("tokentrail.interceptor")

# How long startup waits for the first lease (a report acknowledged, the topic read to its end).
FIRST_LEASE_WAIT_S = 10.0
# Between tries to start following when the topic could not be read at startup. Short: every call dispatched
# until the follower starts is recorded with an unknown version (the soak's interceptor, restarted with the
# broker down, recorded 3 rollouts' calls so: those of the outage, and at 5 s those of up to 5 s after). A try
# against a broker still down waits out its metadata request (10 s) in a thread, so tries stay rare then.
RETRY_S = 1.0


def instance_id(settings: InterceptorSettings) -> str:
    """Unique per interceptor (two in one process, a restart): its writer identity and a random suffix."""
    return f"{settings.source or default_source()}#{uuid.uuid4().hex[:8]}"


async def follow(settings: InterceptorSettings, clock: VersionClock) -> Any:
    """Follow the policy-versions topic into ``clock`` (changes applied on this event loop), reporting what it
    applied; the follower. When the topic cannot be read at startup (the broker down, the topic not made yet) the
    follower is tried again every ``RETRY_S`` in the background (``_Retrying`` stands for it meanwhile): the clock
    has no announced label until then, so calls are recorded with an unknown version, never a stale one."""
    report_as = instance_id(settings)
    follower = await _start(settings, clock, report_as, quiet=False)
    return follower if follower is not None else _Retrying(settings, clock, report_as)


async def _start(settings: InterceptorSettings, clock: VersionClock, report_as: str, *, quiet: bool) -> Any:
    """The started follower, or None (logged unless ``quiet``) when the topic cannot be read now."""
    from schemas.kafka.versions import VersionFollower

    loop = asyncio.get_running_loop()
    lease = _Lease(loop, clock)
    follower: Any = None

    def apply(announcement: Any) -> None:  # on the loop
        clock.announce(announcement)
        follower.applied(clock.step, clock.book.current_label)

    follower = VersionFollower(settings.bootstrap, settings.topics.policy_versions, report_as=report_as,
                               on_change=lambda pv: loop.call_soon_threadsafe(apply, pv),
                               on_fresh=lambda until: loop.call_soon_threadsafe(lease.renew, until),
                               security=settings.kafka)
    try:
        await asyncio.to_thread(follower.start)
    except TransportError as exc:
        if not quiet:
            log.warning("not following policy versions yet: %s; trying again every %.0f s (until then calls are "
                        "recorded with an unknown version)", exc, RETRY_S)
        return None
    if follower.reporting:
        clock.require_lease()
    caught_up = await asyncio.to_thread(follower.wait_caught_up, 10.0)
    await asyncio.sleep(0)  # the applies the follower scheduled so far run before this report
    if caught_up and follower.book.current is not None:
        clock.announce(follower.book.current)
    follower.applied(clock.step, clock.book.current_label)
    if follower.reporting and not await lease.first(FIRST_LEASE_WAIT_S):
        log.warning("no confirmed report of the applied policy version within %.0f s: calls are recorded with an "
                    "unknown version until one is (check the broker and %s)", FIRST_LEASE_WAIT_S,
                    follower.reports_topic)
    follower.lease = lease  # kept alive with the follower
    return follower


class _Retrying:
    """The follower not started yet: tried again every ``RETRY_S`` on the loop until it starts.

    Why: an interceptor that started while the broker was down used to give up following for good; a soak
    found one that then recorded 40 minutes of calls with no version at dispatch (with real vLLM 0.32, whose
    answers carry no versions, every one of them would have been masked). Until it starts, it reports
    nothing, so an announcer does not wait for it, and its clock shows no announced label.
    """

    def __init__(self, settings: InterceptorSettings, clock: VersionClock, report_as: str) -> None:
        self.report_as = report_as
        self.follower: Any = None
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._retry(settings, clock))

    @property
    def reporting(self) -> bool:
        return self.follower is not None and bool(self.follower.reporting)

    async def _retry(self, settings: InterceptorSettings, clock: VersionClock) -> None:
        while self.follower is None:
            await asyncio.sleep(RETRY_S)
            self.follower = await _start(settings, clock, self.report_as, quiet=True)
        log.info("following policy versions now, reporting as %s", self.report_as)

    def close(self) -> None:
        """Stop trying (thread-safe: the interceptor closes it from a worker thread) and close what started."""
        self._loop.call_soon_threadsafe(self._task.cancel)
        if self.follower is not None:
            self.follower.close()


class _Lease:
    """The clock's lease: renewed from the follower's thread (via the loop), expired by a loop timer."""

    def __init__(self, loop: asyncio.AbstractEventLoop, clock: VersionClock) -> None:
        self.loop, self.clock = loop, clock
        self.until = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._renewed = asyncio.Event()

    def renew(self, until: float) -> None:
        if until <= self.until:
            return
        self.until = until
        left = until - time.monotonic()  # the follower's clock (the loop's may be another, or cached)
        if left <= 0:  # already past (a slow loop): nothing to trust
            self.expire()
            return
        self.clock.renew()
        self._renewed.set()
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(left, self.expire)

    def expire(self) -> None:
        if time.monotonic() >= self.until:
            self.clock.expire()
        else:  # a timer that fired early (a coarse loop clock)
            self._timer = self.loop.call_later(self.until - time.monotonic(), self.expire)

    async def first(self, timeout_s: float) -> bool:
        try:
            await asyncio.wait_for(self._renewed.wait(), timeout_s)
        except TimeoutError:
            return False
        return True
