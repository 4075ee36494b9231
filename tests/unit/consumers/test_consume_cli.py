"""``tokentrail consume`` options that reach the consumer's settings (no broker: the run is replaced)."""

from __future__ import annotations

import argparse

import pytest

from consumers import cli


def _settings_after(monkeypatch, *argv: str):
    """The settings `tokentrail consume --bootstrap 127.0.0.1:9 ARGV` would run with."""
    seen = {}

    async def fake_run(settings, sink, max_rollouts):
        seen["settings"] = settings
        return 0

    monkeypatch.setattr(cli, "_run", fake_run)
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    assert cli.main(parser.parse_args(["--bootstrap", "127.0.0.1:9", *argv])) == 0
    return seen["settings"]


def _settings_of(monkeypatch, tmp_path, *argv: str):
    return _settings_after(monkeypatch, "--sink-path", str(tmp_path / "out.jsonl"), *argv)


def test_delivery_traces_sets_the_rules_delivery_mode(monkeypatch, tmp_path):
    settings = _settings_of(monkeypatch, tmp_path, "--delivery", "traces")
    assert settings.rebuild_rules().delivery_mode == "traces"


def test_delivery_overrides_the_rules_json_and_keeps_its_other_rules(monkeypatch, tmp_path):
    settings = _settings_of(monkeypatch, tmp_path, "--rules", '{"delivery_mode": "gym", "toolless_max_tokens": 5}',
                            "--delivery", "traces")
    rules = settings.rebuild_rules()
    assert (rules.delivery_mode, rules.toolless_max_tokens) == ("traces", 5)


def test_without_delivery_the_rules_decide(monkeypatch, tmp_path):
    assert _settings_of(monkeypatch, tmp_path).rebuild_rules().delivery_mode == "terminal"


def test_an_unknown_delivery_is_refused_by_name(capsys):
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--bootstrap", "b", "--delivery", "forest"])
    assert "--delivery" in capsys.readouterr().err


@pytest.mark.parametrize(("sink", "field"), [("kafka", "rebuilt"), ("kafka-groups", "rebuilt_groups")])
def test_a_built_in_kafka_sink_writes_to_this_cluster_under_the_topic_prefix(monkeypatch, sink, field):
    from consumers.sinks import plugin
    from schemas.kafka.topics import topic_names

    built = {}
    monkeypatch.setattr(plugin, "load_sink", lambda target, kwargs: built.update(target=target, kwargs=kwargs))
    settings = _settings_after(monkeypatch, "--sink", sink, "--topic-prefix", "run1.")
    topic = getattr(topic_names("run1."), field)
    assert built["kwargs"] == {"bootstrap": "127.0.0.1:9", "topic": topic}
    from consumers.loop import required_topics

    assert topic in required_topics(settings)  # the startup check waits for it
