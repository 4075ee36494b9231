"""Reading the final answer out of a harness's text and checking it against the task's answer.

Guarantees:

* Fail closed: only a marked answer is taken. The last ``<answer>...</answer>`` tag, else the last
  balanced ``\\boxed{...}`` (or ``\\fbox{...}``), else the last quoted string ("...", “...”, `...`,
  or '...' whose quotes are not apostrophes inside words). Bare unmarked text is NOT an answer: it
  gets reward 0 and ``extracted`` null, so a policy is never rewarded for an answer it did not
  commit to. The one exception is a choice task, whose text's last line may be a lone letter
  ("B", "(B)", "B)", "Answer: B", "The answer is B."; method ``choice_letter``). Reasoning is
  skipped (``<think>...</think>`` blocks, and all before a lone ``</think>``, which chat templates
  open themselves): an answer tag written while thinking is not the answer.
* Built-in kinds give reward 1.0 or 0.0. A custom verifier (``fn(task, final_text)``) is loaded and
  checked at start-up (``load_verifier``/``check_verifiers``: ``ConfigError``); at run time anything
  it raises, and any return other than a bool, a finite number or a dict with a finite ``reward``,
  is a ``VerifierError`` naming the target, which the collector records as a ``verifier_error``
  failure. ``verify`` raises no other error (a built-in verifier's own fault is a VerifierError too).
* Numbers are compared exactly (fractions, not floats): ``|x - a| <= tolerance`` or
  ``|x - a| <= rel_tolerance * |a|``, so two large integers one apart never match. ``x`` is the
  FIRST number of the extracted text: signs, thousands separators ("1,234.5"), decimals,
  scientific notation ("1.5e3", "1.5 \\times 10^{3}"), fractions ("3/4", "\\frac{3}{4}"), and
  trailing units or a currency sign ("42 km", "$3.50") are read. Percent rule: "12.5%" stands for
  both 12.5 and 0.125, so it matches an answer written either way.
"""

from __future__ import annotations

import inspect
import json
import math
import numbers
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, cast

from compose.collect.tasks import TARGET_RULE, Task, shown
from schemas.errors import ConfigError, TokentrailError
from schemas.plugins import load_class

__all__ = ["Verdict", "VerifierError", "extract_answer", "verify", "load_verifier", "check_verifiers",
           "EXTRACTED_LIMIT"]

EXTRACTED_LIMIT = 2000  # characters of ``Verdict.extracted`` kept for result rows; matching uses all of it
_THINK = re.compile(r"<think>.*?</think>", re.I | re.S)
_TAG = re.compile(r"<answer\s*>((?:(?!<answer\s*>).)*?)</answer\s*>", re.I | re.S)
# One pass over the text finds every balanced box: a box opener, an escape (\{ is a literal brace), a brace.
_BOX_TOKENS = re.compile(r"\\(?:boxed|fbox)\s*\{|\\.|[{}]", re.S)
_QUOTES = (re.compile(r'"([^"\n]+)"'), re.compile(r"“([^”\n]+)”"), re.compile(r"`([^`\n]+)`"),
           re.compile(r"(?<![\w'])'([^'\s][^'\n]*)'(?!\w)"), re.compile(r"(?<!\w)‘([^’\n]+)’(?!\w)"))
_WRAPPERS = (("**", "**"), ('"', '"'), ("“", "”"), ("'", "'"), ("‘", "’"), ("`", "`"), ("$", "$"),
             ("\\(", "\\)"))
_LATEX_WRAP = re.compile(r"\\(?:boxed|fbox|text|textbf|mathrm)\s*\{(.*)\}", re.S)
_LETTER = re.compile(r"\(?([A-Za-z])\)?[.):]?")
_PHRASED = re.compile(r"(?i:(?:the\s+)?(?:(?:final|correct)\s+)*answer(?:\s+is)?)\s*[:\-]?\s*\(?([A-Z])\)?[.)]?")
_LETTER_TEXT = re.compile(r"\(?([A-Z])[).:]\s+(.+)", re.S)
_NUMBER = re.compile(
    r"(?:(?<![\w.])(?P<s1>[-+]))?(?:[$€£]\s?)?(?:(?<![\w.])(?P<s2>[-+]))?(?<![\d.])"
    r"(?P<num>(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)(?:[eE](?P<exp>[-+]?\d+))?"
    r"(?:\s*(?:\*|x|×|\\times|\\cdot)\s*10\s*\^\s*\{?\s*(?P<exp10>[-+]?\d+)\s*\}?)?"
    r"(?:\s*/\s*(?P<den>\d+(?:\.\d+)?))?(?P<pct>\s?(?:%|percent\b|per cent\b))?")
_FRAC = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_EXPONENT_LIMIT = 400  # a larger power of ten is not an answer, and building it would cost time and memory


class VerifierError(TokentrailError):
    """A custom verifier raised or returned something that is not a reward; names the target."""


@dataclass(frozen=True)
class Verdict:
    reward: float
    correct: bool
    extracted: str | None  # the answer read from the text (at most EXTRACTED_LIMIT characters); None: none
    method: str | None     # tag, boxed, quoted, choice_letter, custom; None when nothing was read
    verifier: str          # the kind, or the custom target
    detail: str            # why, for a person
    info: dict = field(default_factory=dict)  # a custom verifier's other keys

    def to_json(self) -> dict[str, Any]:
        return {"reward": self.reward, "correct": self.correct, "extracted": self.extracted, "method": self.method,
                "verifier": self.verifier, "detail": self.detail, "info": self.info}


def extract_answer(text: str, *, choices: int = 0) -> tuple[str | None, str | None]:
    """``(answer, method)`` read from ``text``, or ``(None, None)``; ``choices`` > 0 allows a lone letter."""
    if not isinstance(text, str):
        return None, None
    text = _THINK.sub(" ", text)
    reasoning_end = text.lower().rfind("</think>")
    text = text[reasoning_end + len("</think>"):] if reasoning_end >= 0 else text
    tags = _TAG.findall(text)
    if tags:
        return tags[-1].strip(), "tag"
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed.strip(), "boxed"
    quoted = [m for pattern in _QUOTES for m in pattern.finditer(text)]
    if quoted:
        return max(quoted, key=lambda m: m.end()).group(1).strip(), "quoted"
    if choices:
        lines = [line.strip().strip("*").strip() for line in text.splitlines() if line.strip()]
        index = _choice_index(lines[-1], (), choices, lowercase=False) if lines else None
        if index is not None:
            return chr(ord("A") + index), "choice_letter"
    return None, None


def verify(task: Task, final_text: str | None, *, custom: Callable | None = None) -> Verdict:
    """The verdict on ``final_text`` for ``task``; only a custom verifier's misbehaviour raises (VerifierError)."""
    spec = task.verifier
    # A custom spec names its target (load_tasks refuses one without).
    name = cast(str, spec.target) if spec.kind == "custom" else spec.kind
    if not isinstance(final_text, str) or not final_text.strip():
        return Verdict(0.0, False, None, None, name, "no final text")
    if spec.kind == "custom":
        if custom is None:
            raise VerifierError(f"task {task.id!r}: custom verifier {spec.target!r} is not loaded; "
                                "load it at start-up with check_verifiers(tasks) and pass it as custom=")
        return _custom_verdict(custom, name, task, final_text)
    try:
        extracted, method = extract_answer(final_text, choices=len(spec.choices) if spec.kind == "choice" else 0)
        if extracted is None:
            return Verdict(0.0, False, None, None, name,
                           "no marked answer in the final text (expected <answer>...</answer>)")
        correct, detail = _MATCHERS[spec.kind](task, extracted)
    except Exception as exc:  # belt and braces: no text may take the collector down; it becomes a failure
        raise VerifierError(f"task {task.id!r}: the {name} verifier failed on the final text "
                            f"({type(exc).__name__}: {shown(str(exc), 200)})") from exc
    return Verdict(1.0 if correct else 0.0, correct, extracted[:EXTRACTED_LIMIT], method, name, detail)


def load_verifier(target: str) -> Callable:
    """The function ``target = "module:function"`` names, checked to take (task, final_text); else ConfigError."""
    if not isinstance(target, str) or not re.fullmatch(TARGET_RULE, target):
        raise ConfigError(f"verifier target {shown(target)} must be 'module:function' "
                          "(e.g. 'mypkg.verifiers:check'): an importable module and a function in it")
    try:
        fn = load_class(target, "verifier")
    except ConfigError:
        raise
    except (Exception, SystemExit) as exc:  # the module's own import failed (a syntax error, a raise, an exit)
        raise ConfigError(f"could not load verifier {target!r}: importing it raised "
                          f"{type(exc).__name__}: {shown(str(exc), 200)}. Fix the module") from exc
    if not callable(fn):
        raise ConfigError(f"verifier {target!r} is a {type(fn).__name__}, not a function; "
                          "point it at a function fn(task, final_text)")
    if inspect.iscoroutinefunction(fn):
        raise ConfigError(f"verifier {target!r} is async; the collector calls verifiers synchronously: "
                          "make it a plain def fn(task, final_text)")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return fn  # a builtin without a signature cannot be checked here; a wrong call fails as VerifierError
    try:
        signature.bind(None, None)
    except TypeError as exc:
        raise ConfigError(f"verifier {target!r} has signature {signature}: it must accept two positional "
                          f"arguments (task, final_text) ({exc}). Fix its parameters") from exc
    return fn


def check_verifiers(tasks: Iterable[Task]) -> dict[str, Callable]:
    """Every distinct custom target of ``tasks``, loaded once; ConfigError names the first task using a bad one."""
    loaded: dict[str, Callable] = {}
    for task in tasks:
        if task.verifier.kind != "custom":
            continue
        target = cast(str, task.verifier.target)  # a custom spec names its target (load_verifier checks it)
        if target in loaded:
            continue
        try:
            loaded[target] = load_verifier(target)
        except ConfigError as exc:
            raise ConfigError(f"task {task.id!r} (line {task.line}): {exc}") from exc
    return loaded


def _last_boxed(text: str) -> str | None:
    """The content of the last closed outermost box: the closed box that ends last (boxes nest, never overlap)."""
    stack: list[int | None] = []  # per open brace: where its box's content starts, None for a plain brace
    best: tuple[int, int] | None = None
    for token in _BOX_TOKENS.finditer(text):
        lexeme = token.group()
        if lexeme == "}":
            if stack and (start := stack.pop()) is not None:
                best = (start, token.start())
        elif lexeme == "{":
            stack.append(None)
        elif lexeme.endswith("{") and not lexeme.startswith("\\{"):
            stack.append(token.end())
    return None if best is None else text[best[0]:best[1]]


def _unwrap(text: str) -> str:
    """``text`` without surrounding quotes, backticks, ``$``, ``**`` or a whole ``\\boxed{}``/``\\text{}``."""
    while True:
        text = text.strip()
        for left, right in _WRAPPERS:
            if len(text) >= len(left) + len(right) and text.startswith(left) and text.endswith(right):
                text = text[len(left):len(text) - len(right)]
                break
        else:
            match = _LATEX_WRAP.fullmatch(text)
            if match is None or _last_boxed("\\boxed{" + match.group(1) + "}") != match.group(1):
                return text
            text = match.group(1)


def _normal(text: str, case_sensitive: bool) -> str:
    text = _unwrap(text)
    if text.endswith("."):
        text = _unwrap(text[:-1])  # one trailing full stop: "Paris." is "Paris"
    text = " ".join(text.split())
    return text if case_sensitive else text.casefold()


def _match_exact(task: Task, extracted: str) -> tuple[bool, str]:
    cs = task.verifier.case_sensitive
    got = _normal(extracted, cs)
    for answer in task.answers:
        if got == _normal(str(answer), cs):
            return True, f"matches {shown(answer)}"
    return False, f"{shown(got)} is not {' or '.join(shown(a) for a in task.answers)}"


def _number(text: str) -> list[Fraction] | None:
    """The values the first number in ``text`` may stand for (two for a percent), or None when it has none."""
    text = _FRAC.sub(r"\1/\2", text.replace("−", "-").replace("\\%", "%").replace("\\$", "$").replace("{,}", ","))
    match = _NUMBER.search(text)
    if match is None:
        return None
    exponent = int(match["exp"] or 0) + int(match["exp10"] or 0)
    if abs(exponent) > _EXPONENT_LIMIT:
        return None
    try:
        value = Fraction(match["num"].replace(",", "")) * Fraction(10) ** exponent
        if match["den"]:
            value /= Fraction(match["den"])
    except (ValueError, ZeroDivisionError):  # 3/0; or more digits than int() reads
        return None
    if "-" in (match["s1"], match["s2"]):
        value = -value
    return [value, value / 100] if match["pct"] else [value]


def _answer_value(answer: object) -> Fraction | None:
    try:
        if isinstance(answer, float):
            return Fraction(repr(answer))  # the decimal the task author wrote, not the binary float
        value: Any = answer.strip() if isinstance(answer, str) else answer  # Fraction refuses what it cannot read
        return Fraction(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _fmt(value: Fraction) -> str:
    if value.denominator == 1 and abs(value.numerator) < 10 ** 30:
        return str(value.numerator)
    try:
        return repr(float(value))
    except OverflowError:
        return "a number beyond float range"


def _match_numeric(task: Task, extracted: str) -> tuple[bool, str]:
    spec = task.verifier
    got = _number(extracted)
    if got is None:
        return False, f"no number in {shown(extracted)}"
    tolerance, relative = Fraction(spec.tolerance), Fraction(spec.rel_tolerance)
    for answer in task.answers:
        want = _answer_value(answer)
        if want is None:
            continue
        for value in got:
            if abs(value - want) <= tolerance or abs(value - want) <= relative * abs(want):
                return True, f"{_fmt(value)} matches {shown(answer)} (tolerance {spec.tolerance}, " \
                             f"relative {spec.rel_tolerance})"
    return False, f"{_fmt(got[0])} is not {' or '.join(shown(a) for a in task.answers)} " \
                  f"(tolerance {spec.tolerance}, relative {spec.rel_tolerance})"


def _choice_index(text: str, options: tuple[str, ...], count: int, *, lowercase: bool,
                  case_sensitive: bool = False) -> int | None:
    """The option ``text`` names: a letter (alone, "(B)", "Answer: B"), a letter and its text, or an option text."""
    text = _unwrap(text)
    letter = _LETTER.fullmatch(text) or _PHRASED.fullmatch(text)
    if letter and (lowercase or letter.group(1).isupper()) and ord(letter.group(1).upper()) - ord("A") < count:
        return ord(letter.group(1).upper()) - ord("A")
    normal = [_normal(o, case_sensitive) for o in options]
    with_text = _LETTER_TEXT.fullmatch(text)
    if with_text:  # "B) Paris" counts only when the text is option B's own
        index = ord(with_text.group(1)) - ord("A")
        return index if index < len(normal) and _normal(with_text.group(2), case_sensitive) == normal[index] else None
    got = _normal(text, case_sensitive)
    return normal.index(got) if got in normal else None


def _match_choice(task: Task, extracted: str) -> tuple[bool, str]:
    spec = task.verifier
    options, count, cs = spec.choices, len(spec.choices), spec.case_sensitive
    index = _choice_index(extracted, options, count, lowercase=True, case_sensitive=cs)
    wanted = {i for a in task.answers if isinstance(a, (str, int)) and not isinstance(a, bool)
              for i in [_choice_index(str(a), options, count, lowercase=True, case_sensitive=cs)] if i is not None}
    letters = ", ".join(chr(ord("A") + i) for i in sorted(wanted)) or "none of the options"
    if index is None:
        return False, f"{shown(extracted)} names no option (A-{chr(ord('A') + count - 1)}); the answer is {letters}"
    chosen = chr(ord("A") + index)
    return index in wanted, f"option {chosen}; the answer is {letters}"


_MATCHERS: dict[str, Callable[[Task, str], tuple[bool, str]]] = {
    "exact": _match_exact, "numeric": _match_numeric, "choice": _match_choice}


def _custom_verdict(fn: Callable, target: str, task: Task, final_text: str) -> Verdict:
    try:
        out = fn(task, final_text)
    except Exception as exc:
        raise VerifierError(f"custom verifier {target!r} raised {type(exc).__name__}: {shown(str(exc), 200)} on "
                            f"task {task.id!r}; fix the verifier (the rollout is recorded as verifier_error)") from exc
    bad = VerifierError(f"custom verifier {target!r} returned {shown(out)} on task {task.id!r}: it must return a "
                        "bool, a finite number, or a dict with a finite number 'reward' and JSON-able other keys")
    if isinstance(out, bool):
        return Verdict(1.0 if out else 0.0, out, None, "custom", target, f"returned {out}")
    if isinstance(out, dict):
        info = dict(out)
        reward, correct = info.pop("reward", None), info.pop("correct", None)
        extracted, detail = info.pop("extracted", None), info.pop("detail", None)
        try:
            json.dumps(info, allow_nan=False)
        except (TypeError, ValueError, RecursionError) as exc:
            raise bad from exc
        if (correct is not None and not isinstance(correct, bool)) or not isinstance(extracted, (str, type(None))):
            raise bad
    else:
        reward, correct, extracted, detail, info = out, None, None, None, {}
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real):  # numpy's numbers too
        raise bad
    try:
        reward = float(reward)
    except OverflowError as exc:
        raise bad from exc
    if not math.isfinite(reward):
        raise bad
    # "correct" when the verifier does not say: any positive reward (partial credit included).
    return Verdict(reward, reward > 0 if correct is None else correct,
                   None if extracted is None else extracted[:EXTRACTED_LIMIT], "custom", target,
                   detail if isinstance(detail, str) else f"reward {reward}", info)
