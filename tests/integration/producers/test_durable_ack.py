"""Invariant 1 on a real broker: no successful answer before the capture is acknowledged.

A broker of its own is frozen with SIGSTOP while a call is in flight: the answer
waits (or fails), and a success is only ever seen with the event on the topic.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid

import confluent_kafka
import httpx
import pytest

from compose.engines.policy import create_app
from compose.rig.kafka.broker import start_broker, stop_broker
from producers.http.app import Interceptor
from producers.settings import InterceptorSettings
from schemas.codec import decode_event
from schemas.kafka.admin import ensure_topics
from schemas.kafka.topics import topic_names
from schemas.records import CallCaptured

pytestmark = [pytest.mark.integration, pytest.mark.real_broker]

MESSAGES = [{"role": "user", "content": "hello"}]


@pytest.fixture
def own_broker(tmp_path, kafka_flavor):
    if kafka_flavor not in ("jar", "external"):
        pytest.skip("needs a jar broker this test can freeze")
    info = start_broker(tmp_path / "kafka")
    yield info
    os.kill(info.pid, signal.SIGCONT)
    stop_broker(tmp_path / "kafka")


async def _interceptor(bootstrap: str, topics, publish_timeout_ms: int):
    settings = InterceptorSettings(upstream_url="http://policy", bootstrap=bootstrap, topics=topics,
                                   publish_timeout_ms=publish_timeout_ms)
    upstream = httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app()), base_url="http://policy")
    app = Interceptor(settings, upstream=upstream)
    await app.startup()
    return app


def _captured_call_ids(bootstrap: str, topic: str) -> set[str]:
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    ids, deadline = set(), time.monotonic() + 15
    while time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is None:
            if ids:
                break
            continue
        if not msg.error():
            body = decode_event(msg.value()).body
            if isinstance(body, CallCaptured):
                ids.add(body.model_call_id)
    consumer.close()
    return ids


async def test_answer_waits_while_the_broker_is_frozen_and_succeeds_only_once_acknowledged(own_broker):
    topics = topic_names(f"dur{uuid.uuid4().hex[:6]}.")
    ensure_topics(own_broker.bootstrap, topics)
    app = await _interceptor(own_broker.bootstrap, topics, publish_timeout_ms=60_000)
    url = "/ng-rollout/durable-1/training-token-capture/v1/chat/completions"
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://tt", timeout=120) as http:
        warm = await http.post(url, json={"model": "m", "messages": MESSAGES})  # producer id acquired
        assert warm.status_code == 200
        os.kill(own_broker.pid, signal.SIGSTOP)
        try:
            task = asyncio.create_task(http.post(url, json={"model": "m", "messages": MESSAGES + MESSAGES}))
            await asyncio.sleep(4)
            assert not task.done(), "answered while the broker could not acknowledge anything"
        finally:
            os.kill(own_broker.pid, signal.SIGCONT)
        answer = await task
    await app.shutdown()
    assert answer.status_code == 200
    call_id = answer.json()["id"].removeprefix("chatcmpl-tt")
    assert call_id in _captured_call_ids(own_broker.bootstrap, topics.rollout_events)


async def test_a_broker_that_stays_down_gets_a_503_never_a_success(own_broker):
    topics = topic_names(f"dur{uuid.uuid4().hex[:6]}.")
    ensure_topics(own_broker.bootstrap, topics)
    app = await _interceptor(own_broker.bootstrap, topics, publish_timeout_ms=3_000)
    url = "/ng-rollout/durable-2/training-token-capture/v1/chat/completions"
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://tt", timeout=120) as http:
        assert (await http.post(url, json={"model": "m", "messages": MESSAGES})).status_code == 200
        os.kill(own_broker.pid, signal.SIGSTOP)
        try:
            answer = await http.post(url, json={"model": "m", "messages": MESSAGES + MESSAGES})
        finally:
            os.kill(own_broker.pid, signal.SIGCONT)
    await app.shutdown()
    assert answer.status_code == 503 and "durable" in answer.json()["error"]["message"]
