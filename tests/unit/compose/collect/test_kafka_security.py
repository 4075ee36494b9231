"""``tokentrail collect --kafka-config``: parsed once into the settings, refused naming the problem, and
handed to every Kafka client of the run (its finish producer, its reader of the rebuilt topic) and, under
``--local``, to the stack's services."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

import pytest

from compose.collect import cli
from compose.collect import local as collect_local
from compose.collect.local import StackAddress, local_stack
from compose.collect.records import RebuiltRecords
from compose.collect.run import KafkaFinisher
from compose.rig.stack import STACK_ROLES
from schemas.errors import ConfigError
from schemas.kafka.security import ENV_VAR, KafkaSecurity, load_kafka_config
from schemas.kafka.topics import topic_names
from tests.unit.compose.secured_config import PASSWORD, USER, assert_secured, scram_config


def _args(tmp_path: Path, *more: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tokentrail collect")
    cli.configure(parser)
    return parser.parse_args(["--tasks", "t.jsonl", "--harness", "codex", "--out", str(tmp_path / "o.jsonl"), *more])


def test_the_option_and_the_env_var_reach_the_settings(tmp_path, monkeypatch):
    path = scram_config(tmp_path)
    remote = ("--bootstrap", "b:1", "--interceptor-url", "http://i:2")
    settings = cli._settings(_args(tmp_path, *remote, "--kafka-config", str(path)))
    assert (settings.kafka.protocol, settings.kafka.username) == ("SASL_SSL", USER)
    assert PASSWORD not in repr(settings) and PASSWORD not in settings.model_dump_json()
    monkeypatch.setenv(ENV_VAR, str(path))
    assert cli._settings(_args(tmp_path, *remote)).kafka.username == USER
    monkeypatch.delenv(ENV_VAR)
    assert cli._settings(_args(tmp_path, *remote)).kafka == KafkaSecurity()


def test_a_bad_file_or_a_secured_local_broker_exits_2_naming_it(tmp_path, capsys):
    bad = tmp_path / "bad.properties"
    bad.write_text("security.protocol=SASL_SSL\nsasl.mechanism=KERBEROS\n")
    assert cli.main(_args(tmp_path, "--local", "--bootstrap", "b:1", "--kafka-config", str(bad))) == 2
    assert "sasl.mechanism='KERBEROS'" in capsys.readouterr().err
    # --local without --bootstrap starts a PLAINTEXT broker: a secured file cannot reach it.
    assert cli.main(_args(tmp_path, "--local", "--kafka-config", str(scram_config(tmp_path)))) == 2
    err = capsys.readouterr().err
    assert "--bootstrap" in err and "PLAINTEXT" in err and PASSWORD not in err
    assert not (tmp_path / "o.jsonl").exists()


class _Captured(Exception):
    pass


def test_the_reader_of_the_rebuilt_topic_connects_with_it(tmp_path, monkeypatch):
    seen: list[dict] = []

    def consumer(config):
        seen.append(config)
        raise _Captured

    monkeypatch.setattr("confluent_kafka.Consumer", consumer)
    with pytest.raises(_Captured):
        RebuiltRecords("b:1", "t.rebuilt", from_ms=0, security=load_kafka_config(scram_config(tmp_path)))
    assert_secured(seen[0])


def test_the_finish_producer_connects_with_the_stacks_security(tmp_path, monkeypatch):
    seen: list[dict] = []

    class Producer:
        def __init__(self, config, **_):
            seen.append(config)

    monkeypatch.setattr("schemas.kafka.bridge.AckedProducer", Producer)
    stack = StackAddress("b:1", "http://i:2", topic_names(""), None, load_kafka_config(scram_config(tmp_path)))
    KafkaFinisher(stack)
    assert_secured(seen[0])


class _FakeStack:
    made: list[dict] = []

    def __init__(self, bootstrap, run_dir, **kw):
        self.made.append(kw)
        self.interceptor_url, self.topics, self.upstream_kind, self.policy_url = "http://i:2", topic_names(""), "x", "y"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def test_a_local_stack_hands_the_file_to_every_role(tmp_path, monkeypatch):
    monkeypatch.setattr(collect_local, "LocalStack", _FakeStack)
    path = scram_config(tmp_path)
    security = load_kafka_config(path)
    with local_stack(tmp_path / "run", "r1", engine="reference", harness="codex", bootstrap="b:1",
                     kafka=security) as address:
        assert address.kafka == security
    assert _FakeStack.made[-1]["kafka_configs"] == {role: path.resolve() for role in STACK_ROLES}
    with local_stack(tmp_path / "run", "r1", engine="reference", harness="codex", bootstrap="b:1") as address:
        assert address.kafka == KafkaSecurity()
    assert _FakeStack.made[-1]["kafka_configs"] == {}
    with pytest.raises(ConfigError, match="--bootstrap"), contextlib.ExitStack() as stack:
        stack.enter_context(local_stack(tmp_path / "run", "r1", engine="reference", harness="codex", bootstrap=None,
                                        kafka=security))


async def test_the_collector_reads_the_rebuilt_topic_with_the_stacks_security(tmp_path, monkeypatch):
    from compose.collect import run as collect_run
    from compose.collect.journal import Journal, RunHeader
    from compose.collect.settings import CollectSettings
    from compose.collect.tasks import load_tasks, tasks_digest
    from compose.collect.verify import check_verifiers
    from tests.unit.compose.collect.test_run import Finisher, Harness, Records, _tasks

    made: list[dict] = []

    def records(*args, **kw):
        made.append(kw)
        return Records()

    monkeypatch.setattr(collect_run, "RebuiltRecords", records)
    security = load_kafka_config(scram_config(tmp_path))
    s = CollectSettings(tasks=_tasks(tmp_path), harness="openai-sdk", out=tmp_path / "out" / "r.jsonl",
                        bootstrap="b:1", interceptor_url="http://i:2", progress=False)
    s.out.parent.mkdir(parents=True)
    tasks = load_tasks(s.tasks)
    journal = Journal.open(s.journal_path, RunHeader("run1", s.harness, 1, tasks_digest(tasks), 0))
    stack = StackAddress("b:1", "http://i:2", topic_names(""), None, security)
    collector = collect_run.Collector(s, tasks, check_verifiers(tasks), Harness(), stack, journal,
                                      finisher=Finisher(None))
    await collector.run()
    assert made[0]["security"] == security
