"""``tokentrail collect``'s command line: every setting has a documented option, and bad input stops
the command before anything runs, naming the problem."""

from __future__ import annotations

import argparse
import json

import pytest

from compose.collect import cli
from compose.collect.settings import CollectSettings


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokentrail collect")
    cli.configure(parser)
    return parser


def test_every_option_is_documented_and_every_setting_has_an_option(tmp_path):
    parser = _parser()
    options = [a for a in parser._actions if a.option_strings and a.dest != "help"]
    assert all(a.help and len(a.help) > 10 for a in options), [a.dest for a in options if not a.help]
    args = parser.parse_args(["--tasks", "t.jsonl", "--harness", "remote", "--out", str(tmp_path / "o.jsonl"),
                              "--local", "--agent-url", "http://a:1", "--allowed-tools", "Bash(echo:*)"])
    settings = cli._settings(args)
    assert isinstance(settings, CollectSettings)
    # A field no option reaches would be a setting nobody can change: every field is set from args.
    assert set(settings.model_fields_set) == set(CollectSettings.model_fields)
    help_text = parser.format_help()
    for option in ("--tasks", "--harness", "--samples", "--concurrency", "--out", "--local", "--agent-url",
                   "--max-attempts", "--max-steps", "--call-timeout", "--rollout-timeout"):
        assert option in help_text


@pytest.mark.parametrize("argv,expected", [
    (["--harness", "remote", "--local"], "agent_url"),
    (["--harness", "codex"], "--local"),
    (["--harness", "codex", "--local", "--samples", "0"], "samples"),
])
def test_invalid_settings_exit_2_with_the_reason(tmp_path, capsys, argv, expected):
    args = _parser().parse_args(["--tasks", "t.jsonl", "--out", str(tmp_path / "o.jsonl"), *argv])
    assert cli.main(args) == 2
    assert expected in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()


def test_a_bad_task_file_exits_2_before_any_process_starts(tmp_path, capsys):
    tasks = tmp_path / "t.jsonl"
    tasks.write_text(json.dumps({"id": "a", "prompt": "p"}) + "\n")  # no answer
    args = _parser().parse_args(["--tasks", str(tasks), "--harness", "openai-sdk", "--out",
                                 str(tmp_path / "o.jsonl"), "--bootstrap", "127.0.0.1:1",
                                 "--interceptor-url", "http://127.0.0.1:2"])
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "t.jsonl:1" in err and "answer" in err
    assert not (tmp_path / "o.journal.jsonl").exists()
