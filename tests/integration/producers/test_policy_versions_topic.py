"""The policy-versions topic on a real broker: the CLI announces, followers fold, the interceptor follows.

`tokentrail topics` creates it compacted with one partition; `tokentrail versions announce`
publishes (Avro, keyed by label); `versions show` and a ``VersionFollower`` read every label with
its step, the highest step current; an interceptor in process follows announcements made while
it runs, and the calls it captures record the version current at their dispatch.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid

import httpx
import pytest
from confluent_kafka.admin import ConfigResource

from compose.engines.policy import create_app
from producers.http.app import Interceptor
from producers.settings import InterceptorSettings
from schemas.kafka.admin import ensure_topics
from schemas.kafka.bridge import admin_client
from schemas.kafka.topics import topic_names
from schemas.kafka.versions import VersionFollower
from tests.unit.producers.conftest import RecordingPublisher

pytestmark = [pytest.mark.integration, pytest.mark.real_broker]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "compose.cli", "versions", *args], capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def topics(kafka_bootstrap):
    prefix = f"pv{uuid.uuid4().hex[:8]}."
    names = topic_names(prefix)
    ensure_topics(kafka_bootstrap, names)
    return prefix, names


def test_the_cli_announces_and_followers_fold_every_label_in_step_order(kafka_bootstrap, topics):
    prefix, names = topics
    common = ("--bootstrap", kafka_bootstrap, "--topic-prefix", prefix)
    for label, step in (("v1", 1), ("v2", 2)):
        done = _cli("announce", label, "--step", str(step), "--weights", "label-only", *common)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["label"] == label
    shown = _cli("show", "--json", *common)
    assert shown.returncode == 0, shown.stderr
    rows = [json.loads(line) for line in shown.stdout.splitlines()]
    assert rows == [{"label": "v1", "step": 1, "current": False}, {"label": "v2", "step": 2, "current": True}]
    follower = VersionFollower(kafka_bootstrap, names.policy_versions).start()
    try:
        assert follower.wait_caught_up(30)
        assert follower.book.current_label == "v2" and follower.book.step_of("v1") == 1
    finally:
        follower.close()
    admin = admin_client(kafka_bootstrap)
    meta = admin.list_topics(names.policy_versions, timeout=10)
    assert len(meta.topics[names.policy_versions].partitions) == 1
    (future,) = admin.describe_configs([ConfigResource("topic", names.policy_versions)]).values()
    assert future.result(timeout=30)["cleanup.policy"].value == "compact"


def test_a_bad_announcement_names_the_field_and_touches_nothing(kafka_bootstrap, topics):
    prefix, _ = topics
    done = _cli("announce", "v1", "--step", "-3", "--bootstrap", kafka_bootstrap, "--topic-prefix", prefix)
    assert done.returncode == 2 and "step=-3" in done.stderr
    shown = _cli("show", "--bootstrap", kafka_bootstrap, "--topic-prefix", prefix)
    assert shown.returncode == 0 and "no version announced" in shown.stdout


async def test_a_running_interceptor_follows_announcements(kafka_bootstrap, topics):
    from schemas.kafka.announce import announce_version

    prefix, names = topics
    publisher = RecordingPublisher()
    settings = InterceptorSettings(upstream_url="http://policy", bootstrap=kafka_bootstrap, topics=names,
                                   follow_versions=True)
    upstream = httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app()), base_url="http://policy")
    app = Interceptor(settings, publisher=publisher, upstream=upstream)  # type: ignore[arg-type]
    await app.startup()
    try:
        assert app.core.clock.label is None
        await asyncio.to_thread(announce_version, kafka_bootstrap, "step-7", 7, topic=names.policy_versions)
        for _ in range(100):  # the follower applies it on the event loop, soon
            if app.core.clock.label == "step-7":
                break
            await asyncio.sleep(0.1)
        assert (app.core.clock.label, app.core.clock.origin) == ("step-7", "announced")
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://tt") as http:
            health = (await http.get("/healthz")).json()
            assert (health["policy_version"], health["policy_version_origin"], health["following_versions"]) \
                == ("step-7", "announced", True)
            r = await http.post("/ng-rollout/pv-1/training-token-capture/v1/chat/completions",
                                json={"model": "tokentrail-policy", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200, r.text
        (call,) = [e.body for e in publisher.events]
        assert call.facts.dispatch_version == "step-7"
        assert [s.version for s in call.facts.version_spans] == ["step-7"]
    finally:
        await app.shutdown()


def test_announcing_on_a_missing_topic_fails_naming_the_fix_and_creates_nothing(kafka_bootstrap):
    from schemas.kafka.announce import AnnounceFailed, announce_version

    topic = topic_names(f"absent{uuid.uuid4().hex[:8]}.").policy_versions
    with pytest.raises(AnnounceFailed, match="tokentrail topics") as exc:
        announce_version(kafka_bootstrap, "v1", 1, topic=topic, timeout_s=2)
    assert topic in str(exc.value) and kafka_bootstrap in str(exc.value)
    # The dev broker auto-creates topics: an announcement must not leave a non-compacted one behind.
    assert topic not in admin_client(kafka_bootstrap).list_topics(timeout=10).topics


def test_the_follower_skips_what_it_cannot_decode_and_keeps_following(kafka_bootstrap, topics):
    from schemas.kafka.announce import announce_version
    from schemas.kafka.bridge import AckedProducer
    from schemas.kafka.config import producer_config

    _, names = topics
    producer = AckedProducer(producer_config(kafka_bootstrap), name="test-garbage")
    try:
        producer.produce_sync(names.policy_versions, b"junk", b"\x00not avro", timeout_s=30)
        producer.produce_sync(names.policy_versions, b"gone", None, timeout_s=30)  # type: ignore[arg-type]
    finally:
        producer.close_sync(5)
    announce_version(kafka_bootstrap, "v3", 3, topic=names.policy_versions)
    changes = []
    follower = VersionFollower(kafka_bootstrap, names.policy_versions, on_change=changes.append).start()
    try:
        assert follower.wait_caught_up(30)
        assert follower.skipped == 1 and follower.book.current_label == "v3"
        announce_version(kafka_bootstrap, "v4", 4, topic=names.policy_versions)
        for _ in range(100):
            if len(changes) == 2:
                break
            time.sleep(0.1)
        assert [c.label for c in changes] == ["v3", "v4"]
    finally:
        follower.close()
