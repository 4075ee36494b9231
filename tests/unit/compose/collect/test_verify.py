"""Answer extraction and matching on the shapes models really write; custom verifiers and their refusals."""

from __future__ import annotations

import json
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compose.collect.tasks import Task, VerifierSpec
from compose.collect.verify import (
    EXTRACTED_LIMIT,
    VerifierError,
    check_verifiers,
    extract_answer,
    load_verifier,
    verify,
)
from schemas.errors import ConfigError, TokentrailError


def _task(answer, kind=None, **spec) -> Task:
    kind = kind or ("numeric" if isinstance(answer, (int, float)) else "exact")
    return Task(id="t1", prompt="q", answer=answer, verifier=VerifierSpec(kind=kind, **spec), line=3)


CHOICE = _task("B", "choice", choices=("Rome", "Paris", "Oslo", "Bern"))


# --- extraction ------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("<answer>42</answer>", ("42", "tag")),
    ("Thinking...\n<ANSWER>\n  the  final\n  line \n</Answer>\nthanks", ("the  final\n  line", "tag")),
    ("First <answer>1</answer>, then I fixed it: <answer>2</answer>.", ("2", "tag")),
    ("<answer>draft <answer>7</answer>", ("7", "tag")),
    ("a tag beats a box: \\boxed{1} <answer>3</answer> \\boxed{2}", ("3", "tag")),
    ("So the result is $\\boxed{\\frac{1}{2}}$.", ("\\frac{1}{2}", "boxed")),
    ("\\boxed{1} and later \\boxed{x^{2}+\\{y\\}}", ("x^{2}+\\{y\\}", "boxed")),
    ("\\boxed{\\boxed{5}} then an unclosed \\boxed{6", ("\\boxed{5}", "boxed")),
    ("\\fbox{yes}", ("yes", "boxed")),
    ('I said "first" and then "second".', ("second", "quoted")),
    ("The word is “tenalp”.", ("tenalp", "quoted")),
    ("Run `ls` and the answer is `planet`", ("planet", "quoted")),
    ("It's clear: 'planet' isn't a verb", ("planet", "quoted")),
    ("<think>maybe <answer>1</answer></think> It is \\boxed{2}", ("2", "boxed")),
    ("maybe <answer>1</answer>, the template opened the think.</think> So: <answer>2</answer>", ("2", "tag")),
    ("reasoning <answer>1</answer></think> and no answer after it", (None, None)),
    ("The answer is 42.", (None, None)),
    ("I don't know, it's hard to say", (None, None)),
    ("", (None, None)),
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("text, letter", [
    ("B", "B"), ("(B)", "B"), ("B)", "B"), ("B.", "B"), ("Answer: B", "B"), ("The answer is B.", "B"),
    ("Let me think.\nC is wrong.\n\nThe correct answer is (D).", "D"), ("**Final answer: A**", "A"),
])
def test_a_lone_letter_counts_only_for_choice_tasks(text, letter):
    assert extract_answer(text, choices=4) == (letter, "choice_letter")
    assert extract_answer(text) == (None, None)


@pytest.mark.parametrize("text", ["The answer is B, I think, or maybe C.", "E", "a", "Answer: E", "B is right\nok"])
def test_no_letter_is_read_out_of_prose_or_out_of_range(text):
    assert extract_answer(text, choices=4) == (None, None)


# --- matching --------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, answer, reward", [
    ("<answer>Paris</answer>", "paris", 1.0),
    ("<answer>  **Paris.**  </answer>", "Paris", 1.0),
    ("<answer>$x + 1$</answer>", "x   +  1", 1.0),
    ("<answer>\\text{Paris}</answer>", "Paris", 1.0),
    ('<answer>"tenalp"</answer>', "tenalp", 1.0),
    ("<answer>New  York</answer>", "new york", 1.0),
    ("<answer>Paris France</answer>", "Paris", 0.0),
    ("<answer>Lyon</answer>", ["Paris", "Lyon"], 1.0),
])
def test_exact(text, answer, reward):
    verdict = verify(_task(answer, "exact"), text)
    assert (verdict.reward, verdict.correct, verdict.method, verdict.verifier) == \
        (reward, reward == 1.0, "tag", "exact")


def test_exact_may_be_case_sensitive():
    assert verify(_task("Paris", "exact", case_sensitive=True), "<answer>paris</answer>").reward == 0.0
    assert verify(_task("Paris", "exact", case_sensitive=True), "<answer>Paris</answer>").reward == 1.0


@pytest.mark.parametrize("extracted, answer, reward", [
    ("42", 42, 1.0), ("42 km", 42, 1.0), ("$3.50", 3.5, 1.0), ("7 apples", 7, 1.0), ("1,234.5", 1234.5, 1.0),
    ("1,234,567", 1234567, 1.0), ("-17", -17, 1.0), ("−17", -17, 1.0), ("-$3.50", -3.5, 1.0), ("+5", 5, 1.0),
    ("3/4", 0.75, 1.0), ("\\frac{3}{4}", 0.75, 1.0), ("-\\dfrac{1}{2}", -0.5, 1.0), ("1.5e3", 1500, 1.0),
    ("2.5E-3", 0.0025, 1.0), ("1.5 \\times 10^{3}", 1500, 1.0), ("12.5%", 12.5, 1.0), ("12.5%", 0.125, 1.0),
    ("12.5 percent", 12.5, 1.0), ("x = 9, y = 10", 9, 1.0), ("42", "42.0", 1.0), (".5", 0.5, 1.0),
    ("43", 42, 0.0), ("-42", 42, 0.0), ("4,2", 42, 0.0), ("12.5%", 1.25, 0.0), ("3/0", 0, 0.0), ("none", 1, 0.0),
    ("1e999999", 1, 0.0), ("9" * 5000, 1, 0.0),
])
def test_numeric(extracted, answer, reward):
    verdict = verify(_task(answer, "numeric"), f"Work... <answer>{extracted}</answer>")
    assert verdict.reward == reward, verdict.detail


def test_numeric_tolerances_absolute_and_relative():
    assert verify(_task(10.0, tolerance=0.01), "<answer>10.01</answer>").reward == 1.0
    assert verify(_task(10.0, tolerance=0.01), "<answer>10.02</answer>").reward == 0.0
    assert verify(_task(1000, tolerance=0.0, rel_tolerance=0.01), "<answer>1009</answer>").reward == 1.0
    assert verify(_task(1000, tolerance=0.0, rel_tolerance=0.01), "<answer>1011</answer>").reward == 0.0
    assert verify(_task([3, 4]), "<answer>4</answer>").reward == 1.0


def test_large_integers_one_apart_do_not_match():
    big = 2 ** 60
    assert verify(_task(big), f"<answer>{big + 1}</answer>").reward == 0.0
    assert verify(_task(big), f"<answer>{big}</answer>").reward == 1.0


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.integers(-10 ** 30, 10 ** 30), st.floats(-1e12, 1e12, allow_nan=False, allow_infinity=False)))
def test_numeric_property_the_answer_matches_and_one_more_does_not(a):
    task = _task(a, "numeric")
    assert verify(task, f"The result: <answer>{a}</answer>").reward == 1.0
    assert verify(task, f"The result: <answer>{a + 1}</answer>").reward == 0.0


@pytest.mark.parametrize("text, reward", [
    ("<answer>B</answer>", 1.0), ("<answer>(b)</answer>", 1.0), ("<answer>B) Paris</answer>", 1.0),
    ("<answer>paris</answer>", 1.0), ("<answer>Answer: B</answer>", 1.0), ("\\boxed{B}", 1.0),
    ("The answer is B.", 1.0), ("(B)", 1.0), ("<answer>C</answer>", 0.0), ("<answer>Oslo</answer>", 0.0),
    ("<answer>B) Oslo</answer>", 0.0), ("<answer>E</answer>", 0.0), ("<answer>London</answer>", 0.0),
    ("I'd say B or C", 0.0),
])
def test_choice(text, reward):
    assert verify(CHOICE, text).reward == reward


@pytest.mark.parametrize("answer", ["Paris", "paris", ["B"], ["Rome", "Paris"]])
def test_a_choice_answer_may_be_the_option_text(answer):
    task = _task(answer, "choice", choices=("Rome", "Paris", "Oslo", "Bern"))
    assert verify(task, "<answer>B</answer>").reward == 1.0
    assert verify(task, "<answer>C</answer>").reward == 0.0


def test_option_texts_that_are_single_letters_still_match():
    task = _task("y", "choice", choices=("x", "y"))
    assert verify(task, "<answer>y</answer>").reward == 1.0


@pytest.mark.parametrize("text", [None, "", "   \n", "The answer is 4", "no marker at all"])
@pytest.mark.parametrize("task", [_task(4), _task("4", "exact"), CHOICE])
def test_no_marker_fails_closed(task, text):
    verdict = verify(task, text)
    assert (verdict.reward, verdict.correct, verdict.extracted, verdict.method) == (0.0, False, None, None)


def test_a_verdict_serialises_for_result_rows():
    row = verify(_task(4), "<answer>4 apples</answer>").to_json()
    assert json.loads(json.dumps(row)) == row
    assert (row["reward"], row["correct"], row["extracted"], row["method"], row["verifier"]) == \
        (1.0, True, "4 apples", "tag", "numeric")


def test_a_huge_extracted_answer_is_cut_in_the_verdict():
    verdict = verify(_task("x", "exact"), f"<answer>{'y' * 10_000}</answer>")
    assert verdict.reward == 0.0 and len(verdict.extracted) == EXTRACTED_LIMIT


# --- custom verifiers --------------------------------------------------------------------------------

MODULE = """
import math

def ok(task, text):
    return "yes" in text

def half(task, text):
    return 0.5

def rich(task, text):
    return {"reward": 2, "extracted": "y", "detail": "looked", "steps": [1, 2]}

def wrong_flag(task, text):
    return {"reward": 0.0, "correct": True}

def garbage(task, text):
    return "maybe"

def nan(task, text):
    return math.nan

def no_reward(task, text):
    return {"score": 1}

def bool_reward(task, text):
    return {"reward": True}

def not_json(task, text):
    return {"reward": 1, "obj": object()}

def boom(task, text):
    raise KeyError("missing field")

def one_arg(task):
    return True

def three_args(task, text, extra):
    return True

def defaults(task, text=None, *, extra=1):
    return True

async def coro(task, text):
    return True

NOT_CALLABLE = 3
"""


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    (tmp_path / "tt_test_verifiers.py").write_text(textwrap.dedent(MODULE))
    (tmp_path / "tt_broken_verifiers.py").write_text("raise RuntimeError('import-time bug')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "tt_test_verifiers"


def _custom(plugin, name) -> tuple[Task, object]:
    target = f"{plugin}:{name}"
    task = Task(id="c1", prompt="q", answer=None, verifier=VerifierSpec(kind="custom", target=target), line=5)
    return task, load_verifier(target)


@pytest.mark.parametrize("name, text, reward, correct", [
    ("ok", "yes indeed", 1.0, True), ("ok", "no", 0.0, False), ("half", "x", 0.5, True),
    ("rich", "x", 2.0, True), ("wrong_flag", "x", 0.0, True), ("defaults", "x", 1.0, True),
])
def test_custom_verifier_rewards(plugin, name, text, reward, correct):
    task, fn = _custom(plugin, name)
    verdict = verify(task, text, custom=fn)
    assert (verdict.reward, verdict.correct, verdict.method, verdict.verifier) == \
        (reward, correct, "custom", f"{plugin}:{name}")


def test_a_custom_dict_keeps_its_other_keys(plugin):
    task, fn = _custom(plugin, "rich")
    verdict = verify(task, "x", custom=fn)
    assert (verdict.extracted, verdict.detail, verdict.info) == ("y", "looked", {"steps": [1, 2]})


@pytest.mark.parametrize("name, says", [("garbage", '"maybe"'), ("nan", "returned NaN"), ("no_reward", "score"),
                                        ("bool_reward", "true"), ("not_json", "obj"), ("boom", "KeyError")])
def test_a_misbehaving_custom_verifier_is_a_verifier_error(plugin, name, says):
    task, fn = _custom(plugin, name)
    with pytest.raises(VerifierError) as info:
        verify(task, "x", custom=fn)
    assert isinstance(info.value, TokentrailError)
    assert f"{plugin}:{name}" in str(info.value) and says in str(info.value)


def test_an_unloaded_custom_verifier_is_a_verifier_error(plugin):
    task, _ = _custom(plugin, "ok")
    with pytest.raises(VerifierError, match="check_verifiers"):
        verify(task, "yes")


def test_a_custom_verifier_is_not_called_without_text(plugin):
    task, fn = _custom(plugin, "boom")
    assert verify(task, "", custom=fn).reward == 0.0


@pytest.mark.parametrize("target, says", [
    ("no_colon", "module:function"), ("a:b:c", "module:function"), (":fn", "module:function"),
    (None, "module:function"),
    ("tt_no_such_module_here:fn", "No module named"), ("{plugin}:missing", "no attribute 'missing'"),
    ("{plugin}:NOT_CALLABLE", "not a function"), ("{plugin}:one_arg", "two positional"),
    ("{plugin}:three_args", "two positional"), ("{plugin}:coro", "async"),
    ("tt_broken_verifiers:fn", "import-time bug"),
])
def test_load_verifier_refusals(plugin, target, says):
    with pytest.raises(ConfigError, match=says):
        load_verifier(target.format(plugin=plugin) if target else target)


def test_check_verifiers_loads_each_target_once_and_names_the_first_bad_task(plugin):
    good = [_custom(plugin, "ok")[0], _custom(plugin, "ok")[0], _custom(plugin, "half")[0], _task(1)]
    loaded = check_verifiers(good)
    assert sorted(loaded) == [f"{plugin}:half", f"{plugin}:ok"] and all(callable(f) for f in loaded.values())
    bad = Task(id="c9", prompt="q", answer=None, line=12,
               verifier=VerifierSpec(kind="custom", target=f"{plugin}:one_arg"))
    with pytest.raises(ConfigError, match=r"task 'c9' \(line 12\)"):
        check_verifiers([*good, bad])

