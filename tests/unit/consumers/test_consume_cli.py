"""``tokentrail consume`` options that reach the consumer's settings (no broker: the run is replaced)."""

from __future__ import annotations

import argparse
import contextlib
import io

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consumers import cli
from tests.fuzzing import count, fuzz_settings


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


# -- issue 26 item 3 (probe finding 6): a bad flag is one line naming it, its value and the rule ---------------

def _exit_of(monkeypatch, capsys, tmp_path, *argv: str) -> tuple[int, str]:
    async def fake_run(settings, sink, max_rollouts):
        return 0

    monkeypatch.setattr(cli, "_run", fake_run)
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    rc = cli.main(parser.parse_args(["--bootstrap", "127.0.0.1:9", "--sink-path", str(tmp_path / "o.jsonl"), *argv]))
    return rc, capsys.readouterr().err


@pytest.mark.parametrize(("argv", "named"), [
    (("--max-staleness", "-1"), "--max-staleness=-1: input should be greater than or equal to 0"),
    (("--max-mask-fraction", "1.5"), "--max-mask-fraction=1.5"),
    (("--stale-action", "drop"), "stale_action='drop' needs max_staleness"),
])
def test_a_bad_setting_is_one_clean_line_exit_2(monkeypatch, capsys, tmp_path, argv, named):
    rc, err = _exit_of(monkeypatch, capsys, tmp_path, *argv)
    assert rc == 2 and err.count("\n") == 1 and named in err, err
    assert "validation error for" not in err and "errors.pydantic.dev" not in err and "type=" not in err, err


@pytest.mark.fuzz
@fuzz_settings()
@given(flag=st.sampled_from(["--max-staleness", "--max-mask-fraction", "--mask-fraction-min-samples",
                             "--fetch-wait-ms", "--topic-wait"]),
       value=st.one_of(st.integers(min_value=-3, max_value=3), st.sampled_from([2**63, -(2**63), 1e308]),
                       st.floats(allow_nan=True, allow_infinity=True)))
def test_fuzzed_consume_flags_are_accepted_or_one_clean_line(flag, value, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fz")
    with pytest.MonkeyPatch.context() as mp:
        async def fake_run(settings, sink, max_rollouts):
            return 0

        mp.setattr(cli, "_run", fake_run)
        parser = argparse.ArgumentParser()
        cli.configure(parser)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            try:
                args = parser.parse_args(["--bootstrap", "127.0.0.1:9", "--sink-path", str(tmp / "o.jsonl"),
                                          flag, str(value)])
            except SystemExit as exc:  # argparse: not a number of the flag's type
                assert exc.code == 2
                count("consume flags", "argparse usage")
                return
            rc = cli.main(args)
    text = err.getvalue()
    if rc == 0:
        count("consume flags", "accepted")
        return
    assert rc == 2 and text.count("\n") == 1 and flag in text and "Traceback" not in text, text
    assert "validation error for" not in text and "errors.pydantic.dev" not in text, text
    count("consume flags", "exit 2 " + flag)
