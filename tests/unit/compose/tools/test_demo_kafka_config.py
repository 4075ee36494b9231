"""``tokentrail demo`` and ``tokentrail demo-async`` take ``--kafka-config`` for a ``--bootstrap`` broker: it
reaches their stack's services and the async demo's own clients; without ``--bootstrap`` it is refused
before a broker starts (the demos' own broker is PLAINTEXT)."""

from __future__ import annotations

import argparse
import asyncio

import pytest

from compose.rig import stack as rig_stack
from compose.rig.stack import STACK_ROLES, StackError
from compose.tools import demo
from compose.tools.async_demo import run as async_demo
from tests.unit.compose.secured_config import PASSWORD, USER, scram_config


class _Captured(Exception):
    pass


def _parse(configure, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    configure(parser)
    return parser.parse_args(list(argv))


def _no_broker(monkeypatch):
    def refuse(*_a, **_k):
        raise AssertionError("a broker was started")

    for name in ("ensure_jars", "start_broker", "stop_broker"):
        monkeypatch.setattr(f"compose.rig.kafka.broker.{name}", refuse)


def test_demo_hands_the_file_to_every_role_of_its_stack(tmp_path, monkeypatch, capsys):
    path = scram_config(tmp_path)
    made: list[dict] = []

    class Stack:
        def __init__(self, bootstrap, run_dir, **kw):
            made.append(kw)

        def __enter__(self):
            raise StackError("stop here")

        def __exit__(self, *exc):
            pass

    monkeypatch.setattr(rig_stack, "LocalStack", Stack)
    _no_broker(monkeypatch)
    assert demo.main(_parse(demo.configure, "--bootstrap", "b:1", "--kafka-config", str(path))) == 1
    assert made[0]["kafka_configs"] == {role: path.resolve() for role in STACK_ROLES}
    assert demo.main(_parse(demo.configure, "--kafka-config", str(path))) == 2
    out = capsys.readouterr().out
    assert "needs --bootstrap" in out and PASSWORD not in out


def test_demo_async_passes_the_file_to_run_demo_and_refuses_it_without_bootstrap(tmp_path, monkeypatch):
    path = scram_config(tmp_path)
    seen: list[dict] = []

    def run_demo(bootstrap, run_dir, opts, **kw):
        seen.append(kw)
        raise async_demo.DemoError("stop here")

    monkeypatch.setattr(async_demo, "run_demo", run_demo)
    _no_broker(monkeypatch)
    assert async_demo.main(_parse(async_demo.configure, "--bootstrap", "b:1", "--kafka-config", str(path))) == 1
    assert seen[0]["kafka_configs"] == {role: path.resolve() for role in STACK_ROLES}
    assert async_demo.main(_parse(async_demo.configure, "--kafka-config", str(path))) == 2


class _Stack:
    """What DemoLoop uses of a LocalStack: its addresses and its roles' security."""

    def __init__(self, configs):
        from compose.rig.stack import LocalStack

        self._real = LocalStack("b:1", "unused", kafka_configs=configs)
        self.bootstrap, self.topics, self.processor_id = "b:1", self._real.topics, "p"
        self.interceptor_url = "http://i:2"

    def security(self, role):
        return self._real.security(role)


def test_demo_async_announces_and_streams_with_the_stacks_security(tmp_path, monkeypatch):
    configs = rig_stack.one_kafka_config(scram_config(tmp_path))
    loop = async_demo.DemoLoop(async_demo.DemoOptions(), _Stack(configs), "http://e:1", None, tmp_path, print)
    seen: list = []

    def announce_version(*args, security=None, **kw):
        seen.append(security)
        raise _Captured

    def rollout_stream(settings, **kw):
        seen.append(settings.kafka)
        raise _Captured

    monkeypatch.setattr("schemas.kafka.announce.announce_version", announce_version)
    monkeypatch.setattr("consumers.trainer_stream.rollout_stream", rollout_stream)
    with pytest.raises(_Captured):
        loop.announce("step-0", 0)
    with pytest.raises(_Captured):
        asyncio.run(loop.run())
    assert [s.username for s in seen] == [USER, USER]
