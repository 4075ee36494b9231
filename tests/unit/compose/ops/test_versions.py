"""``tokentrail versions``: invalid arguments are exit 2 naming the field, before any I/O; refusals are exit 3."""

from __future__ import annotations

import contextlib
import io
import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

import schemas.kafka.announce as versions
from compose import cli
from compose.engines.vllm_rig import admin
from compose.ops import versions as versions_cli
from schemas.kafka.security import KafkaSecurity
from schemas.policy_versions import PolicyVersion
from tests.fuzzing import count, fuzz_settings

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
    monkeypatch.setattr(versions_cli, "announced_steps", lambda bootstrap, topic, security=None: dict(ON_TOPIC),
                        raising=False)
    return calls


ON_TOPIC = {"default": 0, "step-3": 3}  # what the (patched) topic read finds


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
    monkeypatch.setattr(versions_cli, "announced_steps", lambda bootstrap, topic, security=None: {}, raising=False)
    assert cli.main(["versions", "announce", "v1", "--step", "1", *BOOT]) == 3
    assert "VLLM_SERVER_DEV_MODE=1" in capsys.readouterr().err


# -- issue 26 item 3 (probe finding 5): every bad input is one line, exit 2, naming the field and the fix ----

@pytest.mark.parametrize(("label", "step", "field", "fix"), [
    ("v1", str(2**63), f"step={2**63}", "2**63"),
    ("v1", str(2**64 + 5), "step=", "2**63"),
    ("v\udcff1", "1", "label=", "UTF-8"),  # bytes that are not UTF-8, as Python hands argv over
    ("v\n1", "1", "label=", "newlines"),
    ("v\x001", "1", "label=", "control"),
    ("x" * 100_000, "1", "100000 characters", "at most 256"),
    ("x" * 257, "1", "257 characters", "at most 256"),
    ("default", "9", "label='default' at step=9", "step 0 only"),
])
def test_bad_announce_inputs_are_one_line_exit_2_naming_the_field(label, step, field, fix, announced, capsys):
    assert cli.main(["versions", "announce", label, "--step", step, *BOOT]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid arguments" in err and field in err and fix in err, err
    assert "Traceback" not in err and announced == []


def test_bad_weights_are_exit_2(announced, capsys):
    assert cli.main(["versions", "announce", "v1", "--step", "1", "--weights", "a\udcffb", *BOOT]) == 2
    assert "weights=" in capsys.readouterr().err and announced == []


def test_the_largest_step_and_a_256_character_label_are_announced(announced):
    assert cli.main(["versions", "announce", "x" * 256, "--step", str(2**63 - 1), *BOOT]) == 0
    assert cli.main(["versions", "announce", "default", "--step", "0", *BOOT]) == 0
    assert [a[0][1:] for a in announced if a[0][0] != "wait"] == [("x" * 256, 2**63 - 1), ("default", 0)]


def test_a_label_re_announced_with_another_step_is_refused(announced, capsys):
    assert cli.main(["versions", "announce", "step-3", "--step", "4", *BOOT]) == 2
    err = capsys.readouterr().err
    assert "label='step-3' was announced at step 3, not step=4" in err and "new label" in err
    assert announced == []
    assert cli.main(["versions", "announce", "step-3", "--step", "3", *BOOT]) == 0  # the same again: idempotent


# -- the fuzz tier: the announce inputs (issue 26 item 5) ----------------------------------------------------

LABELS = st.one_of(st.text(st.characters(codec=None, blacklist_categories=()), max_size=12),
                   st.sampled_from(["default", "step-3", "v1", "", " ", "a\nb", "\udcff", "x" * 256, "x" * 257]),
                   st.builds(lambda n: "y" * n, st.integers(min_value=200, max_value=100_000)))
STEPS = st.one_of(st.integers(min_value=-5, max_value=20), st.sampled_from([2**63 - 1, 2**63, 2**64, -(2**63)]),
                  st.integers())
WEIGHTS = st.one_of(st.just(""), st.text(max_size=8), st.sampled_from(["a\nb", "\udcff", "w" * 1025]))


@pytest.mark.fuzz
@fuzz_settings()
@given(label=LABELS, step=STEPS, weights=WEIGHTS)
def test_fuzzed_announce_inputs_are_exit_0_or_one_line_exit_2(label, step, weights):
    test = "versions announce"
    calls: list[tuple] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(versions, "announce_version",
                   lambda bootstrap, label, step, **kw: calls.append((label, step)) or PolicyVersion(label=label,
                                                                                                      step=step))
        mp.setattr(versions, "wait_applied", lambda *args, **kw: [])
        mp.setattr(versions_cli, "announced_steps", lambda bootstrap, topic, security=None: dict(ON_TOPIC),
                   raising=False)
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                # --weights=VALUE: a value such as "-x" is the option's own, as a user would spell it
                rc = cli.main(["versions", "announce", label, "--step", str(step), f"--weights={weights}", *BOOT])
            except SystemExit as exc:  # argparse: a label that looks like an option, e.g. "-x"
                rc = exc.code
    text = err.getvalue()
    valid = (label != "" and len(label) <= 256 and label.isprintable() and 0 <= step < 2**63
             and (label != "default" or step == 0) and ON_TOPIC.get(label, step) == step
             and len(weights) <= 1024 and weights.isprintable())
    if rc == 2 and label.startswith("-"):
        count(test, "argparse usage")
        return
    if valid:
        assert rc == 0 and calls == [(label, step)], (label[:80], step, text)
        count(test, "announced")
        return
    assert rc == 2 and calls == [], (label[:80], step, weights[:40], rc, text)
    assert text.count("\n") == 1 and "Traceback" not in text and "invalid arguments" in text, text[:500]
    assert re.search(r"\b(label|step|weights)=", text), text[:500]
    count(test, "exit 2 " + text.split(": ")[2].split("=")[0].split(" ")[0] if text.count(": ") >= 2 else "exit 2")
