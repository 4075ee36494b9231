"""``tokentrail versions``: invalid arguments are exit 2 naming the field, before any I/O; refusals are exit 3."""

from __future__ import annotations

import json

import pytest

import schemas.kafka.versions as versions
from compose import cli
from compose.engines.vllm_rig import admin
from schemas.kafka.security import KafkaSecurity
from schemas.policy_versions import PolicyVersion

BOOT = ("--bootstrap", "127.0.0.1:9092")


@pytest.fixture
def announced(monkeypatch):
    """announce_version recorded instead of run: a unit test touches no broker."""
    calls: list[tuple[tuple, dict]] = []

    def fake(bootstrap, label, step, **kw):
        calls.append(((bootstrap, label, step), kw))
        return PolicyVersion(label=label, step=step, weights=kw.get("weights", ""))

    def wait(bootstrap, label, step, **kw):
        calls.append((("wait", bootstrap, label, step), kw))
        return ["interceptor@h:1#a"]

    monkeypatch.setattr(versions, "announce_version", fake)
    monkeypatch.setattr(versions, "wait_applied", wait)
    return calls


@pytest.mark.parametrize(("argv", "field"), [
    (["announce", "v1", "--step", "-3", *BOOT], "step=-3"),
    (["announce", "", "--step", "1", *BOOT], "label=''"),
    (["announce", "v1", "--step", "1", "--bootstrap", "localhost"], "bootstrap"),
    (["show", "--bootstrap", ""], "bootstrap"),
    (["announce", "v1", "--step", "1", "--engine", "localhost:8000", *BOOT], "--engine='localhost:8000'"),
    (["announce", "v1", "--step", "1", "--confirm-timeout", "0", *BOOT], "--confirm-timeout=0.0"),
    (["announce", "v1", "--step", "1", "--min-followers", "-1", *BOOT], "--min-followers=-1"),
])
def test_invalid_arguments_exit_2_naming_the_field_and_publish_nothing(argv, field, announced, capsys):
    assert cli.main(["versions", *argv]) == 2
    err = capsys.readouterr().err
    assert "invalid arguments" in err and field in err
    assert announced == []


@pytest.mark.parametrize("argv", [["announce", "v1", *BOOT], ["announce", "v1", "--step", "two", *BOOT],
                                  ["announce", "--step", "1", *BOOT], ["show"]])
def test_a_missing_or_malformed_option_is_argparse_exit_2(argv, announced):
    with pytest.raises(SystemExit) as exc:
        cli.main(["versions", *argv])
    assert exc.value.code == 2 and announced == []


def test_announce_publishes_on_the_prefixed_topic_and_forwards_the_engine(announced, capsys, monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    labelled: list[tuple] = []
    monkeypatch.setattr(admin, "set_version", lambda url, label, **kw: labelled.append((url, label, kw)))
    rc = cli.main(["versions", "announce", "step-3", "--step", "3", "--weights", "label-only", "--engine",
                   "http://127.0.0.1:8000/", "--engine-api-key", "k", "--topic-prefix", "run1.", *BOOT])
    assert rc == 0
    ((args, kw), (waited, wait_kw)) = announced
    assert args == ("127.0.0.1:9092", "step-3", 3)
    assert kw == {"topic": "run1.tokentrail.policy-versions", "weights": "label-only", "confirm": False,
                  "security": KafkaSecurity()}  # no --kafka-config: PLAINTEXT
    # Then it waits for the interceptors to apply it: only then may the trainer resume the engine.
    assert waited == ("wait", "127.0.0.1:9092", "step-3", 3)
    assert wait_kw == {"topic": "run1.tokentrail.policy-versions", "timeout_s": 30.0, "min_followers": 0,
                       "security": KafkaSecurity()}  # the same security as the announcement
    assert labelled == [("http://127.0.0.1:8000/", "step-3", {"api_key": "k"})]
    assert json.loads(capsys.readouterr().out) == {"label": "step-3", "step": 3,
                                                   "topic": "run1.tokentrail.policy-versions",
                                                   "engine": "http://127.0.0.1:8000/",
                                                   "confirmed_by": ["interceptor@h:1#a"]}


def test_no_confirm_does_not_wait(announced, capsys):
    assert cli.main(["versions", "announce", "v1", "--step", "1", "--no-confirm", *BOOT]) == 0
    assert [args[0] for args, _ in announced] == ["127.0.0.1:9092"]
    assert json.loads(capsys.readouterr().out)["confirmed_by"] is None


def test_interceptors_that_do_not_confirm_are_exit_3_naming_them(announced, monkeypatch, capsys):
    def late(*_a, **_kw):
        raise versions.NotConfirmed("1 of 2 live interceptor(s) did not confirm: interceptor@h:2#b (...)",
                                    ["interceptor@h:2#b"])

    monkeypatch.setattr(versions, "wait_applied", late)
    assert cli.main(["versions", "announce", "v1", "--step", "1", "--confirm-timeout", "0.5", *BOOT]) == 3
    assert "interceptor@h:2#b" in capsys.readouterr().err


def test_a_refusal_is_exit_3_with_the_reason(monkeypatch, capsys):
    def refuse(*_a, **_kw):
        raise versions.AnnounceFailed("http://e/update_weight_version answered 404: VLLM_SERVER_DEV_MODE=1")

    monkeypatch.setattr(versions, "announce_version", refuse)
    assert cli.main(["versions", "announce", "v1", "--step", "1", *BOOT]) == 3
    assert "VLLM_SERVER_DEV_MODE=1" in capsys.readouterr().err
