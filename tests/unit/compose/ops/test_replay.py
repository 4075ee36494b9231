"""``tokentrail replay --last-demo`` (``make why``) lives in compose and drives the consumers' replay CLI."""

from __future__ import annotations

import argparse
import json
from types import SimpleNamespace

import pytest

import compose.rig.kafka.broker
import compose.rig.stack
from compose import cli
from compose.ops import replay as replay_cli
from consumers.replay import cli as consumers_replay


@pytest.fixture
def demo(tmp_path, monkeypatch):
    """A kept demo run, a broker that restarts on it, and a replay that records what it was given."""
    last_run = tmp_path / "last-run.json"
    last_run.write_text(json.dumps({"kafka_dir": str(tmp_path / "kafka"), "topic_prefix": "demo1.",
                                    "rollouts": ["r0", "r1"], "masked": ["r1"]}))
    calls = SimpleNamespace(restarted=[], stopped=[], replayed=[])
    monkeypatch.setattr(compose.rig.stack, "LAST_RUN", last_run)
    monkeypatch.setattr(compose.rig.kafka.broker, "restart_broker",
                        lambda d: calls.restarted.append(d) or SimpleNamespace(bootstrap="127.0.0.1:9999"))
    monkeypatch.setattr(compose.rig.kafka.broker, "stop_broker", lambda d, keep_data: calls.stopped.append((d, keep_data)))

    def fake_main(args):
        calls.replayed.append(args)
        return 0

    monkeypatch.setattr(consumers_replay, "main", fake_main)
    return calls


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    replay_cli.configure(parser)
    return parser.parse_args(list(argv))


def test_the_tokentrail_replay_subcommand_is_the_compose_wrapper():
    assert cli.SUBCOMMANDS["replay"][0] == "compose.ops.replay"


def test_last_demo_replays_the_masked_rollouts_on_the_restarted_broker(demo, tmp_path):
    assert replay_cli.main(_args("--last-demo")) == 0
    (args,) = demo.replayed
    assert (args.bootstrap, args.topic_prefix, args.rollout, args.last_demo) == ("127.0.0.1:9999", "demo1.", ["r1"], False)
    assert demo.restarted == [str(tmp_path / "kafka")]
    assert demo.stopped == [(str(tmp_path / "kafka"), True)]  # its log kept for the next `make why`


def test_named_rollouts_win_over_the_masked_ones(demo):
    assert replay_cli.main(_args("--last-demo", "--rollout", "r0")) == 0
    assert demo.replayed[0].rollout == ["r0"]


def test_the_broker_is_stopped_when_the_replay_fails(demo, monkeypatch):
    def boom(args):
        raise RuntimeError("replay failed")

    monkeypatch.setattr(consumers_replay, "main", boom)
    with pytest.raises(RuntimeError):
        replay_cli.main(_args("--last-demo"))
    assert len(demo.stopped) == 1


def test_no_demo_yet_says_run_make_demo(demo, capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(compose.rig.stack, "LAST_RUN", tmp_path / "missing.json")
    assert replay_cli.main(_args("--last-demo")) == 2
    assert "run `make demo` first" in capsys.readouterr().err and not demo.restarted


def test_a_broker_that_cannot_restart_is_reported(demo, capsys, monkeypatch):
    def refuse(d):
        raise compose.rig.kafka.broker.BrokerError("no jars")

    monkeypatch.setattr(compose.rig.kafka.broker, "restart_broker", refuse)
    assert replay_cli.main(_args("--last-demo")) == 2
    assert "cannot restart the demo's broker: no jars" in capsys.readouterr().err and not demo.replayed


def test_without_last_demo_the_arguments_go_to_the_consumers_replay(demo):
    assert replay_cli.main(_args("--bootstrap", "b:1", "--rollout", "x")) == 0
    assert demo.replayed[0].bootstrap == "b:1" and demo.replayed[0].rollout == ["x"]


def test_without_a_broker_it_asks_for_one(demo, capsys):
    assert replay_cli.main(_args("--rollout", "x")) == 2
    assert "--bootstrap is required (or --last-demo)" in capsys.readouterr().err and not demo.replayed


def test_last_demo_drops_an_exported_kafka_config_the_demos_plaintext_broker_is_not_its(demo, monkeypatch):
    monkeypatch.setenv("TOKENTRAIL_KAFKA_CONFIG", "/etc/kafka/prod.properties")
    args = _args("--last-demo")
    assert args.kafka_config == "/etc/kafka/prod.properties"
    assert replay_cli.main(args) == 0
    assert demo.replayed[0].kafka_config is None
