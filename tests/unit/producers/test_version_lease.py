"""The interceptor's side of the applied-version protocol (version_clock lease, version_feed), without a broker.

A report of an applied version always follows the clock (never precedes it); an announced label is
trusted only while the lease is fresh, so a token observed after the lease ran out is of unknown
version, never of the old one.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import schemas.kafka.versions as kafka_versions
from producers.capture import version_feed
from producers.capture.version_clock import VersionClock
from producers.settings import InterceptorSettings
from schemas.errors import TransportError
from schemas.policy_versions import PolicyVersion, observed_spans


def test_a_leased_clock_shows_an_announced_label_only_while_fresh():
    clock = VersionClock()
    clock.announce(PolicyVersion(label="v1", step=1))
    assert clock.label == "v1"  # not leased: as before
    clock.require_lease()
    assert clock.label is None
    clock.renew()
    assert clock.label == "v1" and clock.step == 1
    clock.announce(PolicyVersion(label="v2", step=2))
    assert clock.label == "v2"
    clock.expire()
    assert clock.label is None and clock.step == 2  # it applied v2; it only does not trust it now
    clock.set_admin("v9")  # the admin route is synchronous: no lease needed
    assert clock.label == "v9"
    clock.expire()
    assert clock.label == "v9"


def test_tokens_observed_while_the_lease_is_out_are_unknown_never_old():
    clock = VersionClock()
    clock.require_lease()
    clock.announce(PolicyVersion(label="v1", step=1))
    clock.renew()
    call = clock.start_call()
    call.observe(clock.label, 0)
    clock.expire()  # the announcer may have moved on without us
    call.observe(clock.label, 4)
    clock.announce(PolicyVersion(label="v2", step=2))
    clock.renew()
    call.observe(clock.label, 6)
    assert [(s.version, s.start, s.end) for s in observed_spans(call.marks, 9)] == [("v1", 0, 4), ("", 4, 6),
                                                                                   ("v2", 6, 9)]


async def test_the_lease_expires_at_its_end_unless_renewed():
    clock = VersionClock()
    clock.require_lease()
    clock.announce(PolicyVersion(label="v1", step=1))
    lease = version_feed._Lease(asyncio.get_running_loop(), clock)
    lease.renew(time.monotonic() - 0.01)  # already over when it arrives: nothing to trust
    assert clock.label is None
    lease.renew(time.monotonic() + 0.1)
    assert clock.label == "v1"
    await asyncio.sleep(0.05)
    lease.renew(time.monotonic() + 0.15)  # renewed before the end: still trusted past the first end
    await asyncio.sleep(0.1)
    assert clock.label == "v1"
    await asyncio.sleep(0.15)
    assert clock.label is None


class FakeFollower:
    """Stands in for schemas.kafka.versions.VersionFollower: records what the interceptor reports, and when."""

    made: list[FakeFollower] = []

    def __init__(self, bootstrap, topic, *, report_as, on_change, on_fresh, **_kw):
        self.report_as, self.on_change, self.on_fresh = report_as, on_change, on_fresh
        self.reports_topic = topic + "-applied"
        self.reporting = True
        self.book = kafka_versions.VersionBook()
        self.reports: list[tuple[int | None, str | None]] = []
        self.clock: VersionClock | None = None
        self.label_when_reported: list[str | None] = []
        FakeFollower.made.append(self)

    def start(self):
        return self

    def wait_caught_up(self, _timeout):
        return True

    def applied(self, step, label):
        self.reports.append((step, label))

    def close(self):
        pass


async def test_a_report_follows_the_clock_and_the_first_lease_is_awaited(monkeypatch):
    FakeFollower.made.clear()
    monkeypatch.setattr(kafka_versions, "VersionFollower", FakeFollower)
    clock = VersionClock()
    settings = InterceptorSettings(upstream_url="http://engine", bootstrap="unused:9092")

    async def fresh_soon():
        while not FakeFollower.made:
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.05)
        FakeFollower.made[0].on_fresh(time.monotonic() + 5)

    renewer = asyncio.create_task(fresh_soon())
    follower = await version_feed.follow(settings, clock)
    await renewer
    assert follower.report_as.startswith("interceptor@") and "#" in follower.report_as
    assert clock.leased and clock.fresh and follower.reports == [(None, None)]
    # An announcement read by the follower's thread: applied on the loop, then reported, in that order.
    seen: list[tuple] = []
    original = follower.applied
    follower.applied = lambda step, label: (seen.append((step, label, clock.label)), original(step, label))
    threading.Thread(target=follower.on_change, args=(PolicyVersion(label="v3", step=3),)).start()
    for _ in range(200):
        if seen:
            break
        await asyncio.sleep(0.005)
    assert seen == [(3, "v3", "v3")]  # the clock already showed v3 when the report went out


async def test_a_follower_that_cannot_start_is_tried_again_until_it_does(monkeypatch):
    """The broker down at startup: no announced label meanwhile, then the follower starts and reports (soak finding)."""
    FakeFollower.made.clear()
    refusals = [2]

    class Late(FakeFollower):
        def start(self):
            if refusals[0]:
                refusals[0] -= 1
                raise TransportError("cannot read t at b: Local: Broker transport failure")
            return self

    monkeypatch.setattr(kafka_versions, "VersionFollower", Late)
    monkeypatch.setattr(version_feed, "RETRY_S", 0.02)
    monkeypatch.setattr(version_feed, "FIRST_LEASE_WAIT_S", 0.01)
    clock = VersionClock()
    settings = InterceptorSettings(upstream_url="http://engine", bootstrap="unused:9092")
    following = await version_feed.follow(settings, clock)
    assert following.follower is None and not following.reporting and clock.label is None
    for _ in range(200):
        if following.follower is not None:
            break
        await asyncio.sleep(0.01)
    started = following.follower
    assert started is FakeFollower.made[-1] and len(FakeFollower.made) == 3  # two refused, the third started
    assert following.reporting and started.report_as == following.report_as  # one identity across the tries
    started.on_fresh(time.monotonic() + 5)
    threading.Thread(target=started.on_change, args=(PolicyVersion(label="v2", step=2),)).start()
    for _ in range(200):
        if clock.label == "v2":
            break
        await asyncio.sleep(0.005)
    assert clock.label == "v2" and clock.fresh and started.reports[-1] == (2, "v2")
    await asyncio.to_thread(following.close)


async def test_closing_a_follower_still_being_retried_stops_the_tries(monkeypatch):
    class Never(FakeFollower):
        def start(self):
            raise TransportError("cannot read t at b")

    monkeypatch.setattr(kafka_versions, "VersionFollower", Never)
    monkeypatch.setattr(version_feed, "RETRY_S", 0.01)
    following = await version_feed.follow(InterceptorSettings(upstream_url="http://engine", bootstrap="unused:9092"),
                                          VersionClock())
    await asyncio.sleep(0.05)
    await asyncio.to_thread(following.close)
    await asyncio.sleep(0.02)
    tries = len(FakeFollower.made)
    await asyncio.sleep(0.05)
    assert len(FakeFollower.made) == tries and following._task.done()  # no try after the close


def test_two_interceptors_in_one_process_report_under_distinct_ids():
    settings = InterceptorSettings(upstream_url="http://engine", bootstrap="unused:9092")
    assert version_feed.instance_id(settings) != version_feed.instance_id(settings)


@pytest.mark.parametrize("source", ["interceptor@a:1", "pod-7"])
def test_the_instance_id_starts_with_the_writer_identity(source):
    settings = InterceptorSettings(upstream_url="http://engine", bootstrap="unused:9092", source=source)
    assert version_feed.instance_id(settings).startswith(source + "#")
