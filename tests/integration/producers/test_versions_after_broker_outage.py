"""An interceptor started while the broker is down follows the policy versions once it is back (a soak finding).

It used to log "not following policy versions" and give up for good: the hour-long soak's interceptor,
restarted during a broker outage, recorded the next 40 minutes of calls with no version at dispatch
(``producers.capture.version_feed._Retrying``). Real processes, the run's own broker (it is killed).
"""

from __future__ import annotations

import time
import uuid

import httpx
import pytest

from compose.rig.kafka import broker as kafka_broker
from compose.rig.stack import LocalStack
from schemas.kafka.announce import announce_version

pytestmark = [pytest.mark.integration, pytest.mark.real_broker]


def _health(url: str) -> dict:
    return httpx.get(f"{url}/healthz", timeout=10).json()


def test_an_interceptor_started_during_a_broker_outage_follows_and_confirms_once_it_is_back(tmp_path):
    broker = kafka_broker.start_broker(tmp_path / "kafka", partitions=1, properties=kafka_broker.FAST_RESTART)
    try:
        with LocalStack(broker.bootstrap, tmp_path / "stack", topic_prefix=f"vo{uuid.uuid4().hex[:8]}.",
                        with_pipeline=False) as stack:
            announce_version(broker.bootstrap, "v1", 1, topic=stack.topics.policy_versions)
            kafka_broker.kill_broker(tmp_path / "kafka")
            stack.kill("interceptor")
            stack.restart("interceptor")  # starts with the broker down
            assert _health(stack.interceptor_url)["following_versions"] is False
            kafka_broker.restart_broker(tmp_path / "kafka")
            deadline = time.monotonic() + 60
            while not (health := _health(stack.interceptor_url))["version_instance"] and time.monotonic() < deadline:
                time.sleep(0.5)
            assert health["following_versions"] and health["version_instance"], health
            assert health["policy_version"] == "v1"  # read from the topic once it could
            announce_version(broker.bootstrap, "v2", 2, topic=stack.topics.policy_versions)  # waits for its report
            assert _health(stack.interceptor_url)["policy_version"] == "v2"
    finally:
        kafka_broker.stop_broker(tmp_path / "kafka")
