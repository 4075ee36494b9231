"""The local stack's reading of its JSONL sink and the flags it gives its services (no processes started)."""

from __future__ import annotations

import json

from compose.rig.stack import LocalStack, read_delivered


def test_a_line_the_sink_is_still_writing_is_left_for_the_next_read(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    assert read_delivered(path) == []
    whole = [{"rollout_id": "a", "n": 1}, {"rollout_id": "b", "n": 2}]
    text = "".join(json.dumps(r) + "\n" for r in whole)
    path.write_text(text + '{"rollout_id": "c", "log_probs": [-0.5, -1.2')  # mid-write of a large record
    assert read_delivered(path) == whole
    path.write_text(text + json.dumps({"rollout_id": "c"}) + "\n")
    assert [r["rollout_id"] for r in read_delivered(path)] == ["a", "b", "c"]


def test_fold_workers_and_consumers_wait_the_stacks_broker_wait(tmp_path, monkeypatch):
    spawned: dict[str, tuple[str, ...]] = {}
    monkeypatch.setattr(LocalStack, "_spawn", lambda self, name, *argv, **_: spawned.setdefault(name, argv))
    stack = LocalStack("127.0.0.1:9", tmp_path, topic_wait_s=45.0)
    stack.add_processor("processor", wait=False)
    stack.add_consumer("consumer")
    for name in ("processor", "consumer"):
        argv = spawned[name]
        assert argv[argv.index("--topic-wait") + 1] == "45.0", argv


def test_each_service_gets_its_roles_kafka_config_and_never_an_inherited_one(tmp_path, monkeypatch):
    from compose.rig import stack as rig_stack
    from compose.rig.stack import STACK_ROLES, one_kafka_config
    from schemas.kafka.security import ENV_VAR
    from tests.unit.compose.secured_config import scram_config

    spawned: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {}
    monkeypatch.setattr(rig_stack, "spawn", lambda name, argv, *, env, **_: spawned.setdefault(name, (argv, env)))
    monkeypatch.setenv(ENV_VAR, "/inherited/client.properties")
    path = scram_config(tmp_path)
    configs = one_kafka_config(path)
    assert configs == {role: path.resolve() for role in STACK_ROLES} and one_kafka_config(None) == {}
    stack = LocalStack("127.0.0.1:9", tmp_path, kafka_configs=configs)
    stack.add_processor("processor", wait=False)
    stack.add_consumer("consumer")
    stack._spawn("policy", "policy", "--middleware", "producers.middleware.TokentrailMiddleware")
    for name in ("processor", "consumer", "policy"):
        argv, env = spawned[name]
        assert env[ENV_VAR] == str(path.resolve()), name
        if name != "policy":
            assert argv[argv.index("--kafka-config") + 1] == str(path.resolve())
    plain = LocalStack("127.0.0.1:9", tmp_path)
    spawned.clear()
    plain.add_consumer("consumer")
    argv, env = spawned["consumer"]
    assert "--kafka-config" not in argv and env[ENV_VAR] == "", "the inherited value must not reach the service"


def test_a_tools_kafka_config_is_checked_before_anything_starts(tmp_path):
    import argparse

    import pytest

    from compose.rig.stack import STACK_ROLES, kafka_configs_of_args, role_security
    from schemas.kafka.security import KafkaConfigError
    from tests.unit.compose.secured_config import USER, scram_config

    path = scram_config(tmp_path)
    configs = kafka_configs_of_args(argparse.Namespace(kafka_config=str(path), bootstrap="b:1"))
    assert configs == {role: path.resolve() for role in STACK_ROLES}
    assert role_security(configs, "admin").username == USER and role_security({}, "admin") is None
    assert kafka_configs_of_args(argparse.Namespace(kafka_config=None, bootstrap=None)) == {}
    with pytest.raises(KafkaConfigError, match="needs --bootstrap.*PLAINTEXT"):
        kafka_configs_of_args(argparse.Namespace(kafka_config=str(path), bootstrap=None))
    bad = tmp_path / "bad.properties"
    bad.write_text("security.protocol=SASL_SSL\nsasl.mechanism=GSSAPI\n")
    with pytest.raises(KafkaConfigError, match="sasl.mechanism=GSSAPI"):
        kafka_configs_of_args(argparse.Namespace(kafka_config=str(bad), bootstrap="b:1"))
