"""The pipeline on a secured broker: SASL_SSL (SCRAM, PLAIN), mutual TLS, the StandardAuthorizer, ACLs per role.

One jar broker for the module (`start_broker(secure=True)`), the ACL table of docs/deploying.md for this
module's topic prefix, and every process given its own role's client config file (``--kafka-config``):
one rollout runs end to end, after the trainer announced a version and the interceptor confirmed it
applied it (the reports topic under the ACL table); a principal without an ACL is refused with TopicAuthorizationFailed; a wrong
password fails a process at start, quickly, instead of hanging.
"""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
import time
import uuid

import pytest

from compose.harnesses.sdk import run_rollout
from compose.rig.kafka import secure
from compose.rig.kafka.broker import start_broker, stop_broker
from compose.rig.stack import LocalStack
from schemas.kafka.announce import announce_version
from schemas.kafka.bridge import AckedProducer, KafkaAuthFailed, PublishFailed, check_credentials
from schemas.kafka.config import QUIET_LOGGER, producer_config
from schemas.kafka.security import Secret
from schemas.kafka.topics import topic_names
from tests.conftest import _jar_unavailable

pytestmark = [pytest.mark.integration]

PREFIX = f"sec{uuid.uuid4().hex[:6]}."
PROCESSOR_ID = f"sec-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    if (why := _jar_unavailable()) is not None:
        pytest.skip(f"the secured broker runs from the Kafka jars: {why}")
    state = tmp_path_factory.mktemp("kafka-secure")
    info = start_broker(state, partitions=2, secure=True)
    try:
        rig = secure.SecureRig(state.resolve() / "secure")
        secure.apply_acls(info.bootstrap, rig, secure.role_acls(topic_names(PREFIX), processor_id=PROCESSOR_ID,
                                                                 consumer_group=f"{PROCESSOR_ID}-consumer"))
        yield info.bootstrap, rig
    finally:
        stop_broker(state)


def test_one_rollout_end_to_end_with_a_principal_per_role(secured, tmp_path):
    bootstrap, rig = secured
    configs = {role: rig.config_path(role) for role in ("admin", "interceptor", "processor", "consumer")}
    with LocalStack(bootstrap, tmp_path, topic_prefix=PREFIX, processor_id=PROCESSOR_ID, partitions=2,
                    kafka_configs=configs) as stack:
        # The trainer's principal announces and waits for the interceptor's report (confirm, the default):
        # its producer and its reader of the reports topic, the interceptor's follower and report producer,
        # all under their own role's ACLs.
        announce_version(bootstrap, "sec-v1", 1, topic=topic_names(PREFIX).policy_versions,
                         security=rig.security("trainer"), min_followers=1, confirm_timeout_s=30)
        rollout = f"secure-{uuid.uuid4().hex[:6]}"
        outcome = asyncio.run(run_rollout(stack.capture_base_url(rollout), rollout, "weather in Oslo?",
                                          tool_calls=1))
        assert outcome.error is None
        stack.finish(rollout, {"reward": 1.0}, final_text=outcome.final_text)
        record = stack.wait_rollouts([rollout], timeout=60)[rollout]
    assert record["mask_sample"] is False, record.get("mask_reasons")


def test_a_principal_without_the_acl_is_refused_clearly(secured):
    bootstrap, rig = secured
    harness = rig.security("harness")  # SASL PLAIN: authenticated, but no ACL at all
    assert check_credentials(bootstrap, harness, timeout_s=10)
    producer = AckedProducer(producer_config(bootstrap, security=harness, delivery_timeout_ms=10_000,
                                             extra={"logger": QUIET_LOGGER}))
    try:
        with pytest.raises(PublishFailed) as refused:
            producer.produce_sync(topic_names(PREFIX).snapshots, b"k", b"forged snapshot", timeout_s=15)
    finally:
        producer.close_sync(1)
    assert "TOPIC_AUTHORIZATION_FAILED" in str(refused.value) and "grant it WRITE" in str(refused.value)
    assert refused.value.permanent and not refused.value.possibly_persisted


def test_a_wrong_password_fails_at_start_not_a_hang(secured, tmp_path):
    bootstrap, rig = secured
    wrong = dataclasses.replace(rig.security("consumer"), password=Secret("not-the-password"))
    started = time.monotonic()
    with pytest.raises(KafkaAuthFailed) as refused:
        check_credentials(bootstrap, wrong, timeout_s=20)
    assert time.monotonic() - started < 10
    text = str(refused.value)
    assert "user consumer" in text and "sasl.password" in text and "not-the-password" not in text

    # The same through a process: `tokentrail process` with a config file holding a wrong password.
    bad = tmp_path / "bad.properties"
    bad.write_text(rig.config_path("processor").read_text().replace("sasl.password=", "sasl.password=x"))
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "compose.cli", "process", "--bootstrap", bootstrap,
                           "--kafka-config", str(bad), "--topic-prefix", PREFIX, "--app-id", PROCESSOR_ID,
                           "--data-dir", str(tmp_path / "p"), "--topic-wait", "30"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 4, proc.stderr
    assert time.monotonic() - started < 25  # well before --topic-wait 30
    assert "refused SASL_SSL SCRAM-SHA-512 user processor" in proc.stderr and "sasl.password" in proc.stderr
