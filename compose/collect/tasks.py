"""The task file: one JSON object a line, read into frozen ``Task`` values or refused.

Guarantees:

* ``load_tasks`` returns only tasks the collector can run, or raises ``TaskError`` (a ``ConfigError``)
  naming ``path:line``, the field, the value (shortened) and the fix. Nothing is rewritten.
* Task ids match ``TASK_ID_RULE`` (the rollout-id alphabet, at most 64 characters): the collector
  builds rollout ids ``<run>.<task>-<sample>`` from them. Ids and ``_ng_rollout_id`` values are
  unique in a file; a duplicate names both lines.
* Native rows: ``id``, ``prompt``, ``answer``, optional ``verifier``, ``choices``, ``tools``, ``files``,
  ``metadata``, ``_ng_rollout_id``; any other key is refused. NeMo Gym rows (with
  ``responses_create_params``; see ``compose.collect.task_rows.gym_fields``) keep every key they do not map in metadata.
* NaN, Infinity, numbers that overflow to infinity and duplicate keys are refused.
* ``tasks_digest``: SHA-256 over a canonical JSON of the tasks' content (sorted keys, tasks ordered by
  id, no line numbers), equal in every process. Moving rows or adding blank lines keeps it; changing
  any prompt, answer, verifier, tool, file or metadata changes it.
* A custom verifier's target is checked for its ``module:function`` form only; it is imported at
  start-up by ``compose.collect.verify.check_verifiers``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from compose.collect.task_rows import TaskError, shown
from compose.collect.task_rows import field_error as _fail
from compose.collect.task_rows import gym_fields as _gym_fields
from compose.collect.task_rows import json_object as _object
from schemas.errors import ContractError
from schemas.ids import validate_rollout_id

__all__ = ["Task", "VerifierSpec", "TaskError", "load_tasks", "tasks_digest", "shown", "KINDS", "TASK_ID_RULE",
           "TARGET_RULE"]

TASK_ID_RULE = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
_TASK_ID = re.compile(TASK_ID_RULE)
TARGET_RULE = r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$"  # "module.path:function"
_TARGET = re.compile(TARGET_RULE)
# A numeric answer given as text: a plain decimal, so the file never needs the verifier's looser parser.
_NUMBER_TEXT = re.compile(r"^\s*[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?\s*$")
KINDS = ("exact", "numeric", "choice", "custom")
_NATIVE_KEYS = ("id", "prompt", "answer", "verifier", "choices", "tools", "files", "metadata", "_ng_rollout_id")
_SPEC_KEYS = ("kind", "tolerance", "rel_tolerance", "choices", "target", "case_sensitive")
# The fields each kind reads; any other given field is a mistake (e.g. a tolerance on an exact task).
_APPLIES = {"exact": {"case_sensitive"}, "numeric": {"tolerance", "rel_tolerance"},
            "choice": {"choices", "case_sensitive"}, "custom": set(_SPEC_KEYS)}



@dataclass(frozen=True)
class VerifierSpec:
    """How a task's answer is checked; ``compose.collect.verify`` reads it."""

    kind: str
    tolerance: float = 1e-6        # numeric: absolute
    rel_tolerance: float = 0.0     # numeric: relative to |answer|
    choices: tuple[str, ...] = ()  # choice: option texts, lettered A, B, C...
    target: str | None = None      # custom: "module:function"
    case_sensitive: bool = False

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "choices": list(self.choices)}


@dataclass(frozen=True)
class Task:
    """One task. ``files`` and ``metadata`` are the loader's own copies: treat them as read-only."""

    id: str
    prompt: str
    answer: object                 # str, number, or a list of accepted answers; None only for custom
    verifier: VerifierSpec
    tools: tuple[dict, ...] = ()
    files: dict[str, str] = field(default_factory=dict)
    metadata: dict = field(default_factory=dict)
    rollout_id: str | None = None
    line: int = 0

    @property
    def answers(self) -> tuple[object, ...]:
        """Every accepted answer (a list answer's items, else the one answer)."""
        return tuple(self.answer) if isinstance(self.answer, list) else (self.answer,)

    def to_json(self) -> dict[str, Any]:
        """The task's content as JSON (no line number): what ``tasks_digest`` hashes."""
        return {"id": self.id, "prompt": self.prompt, "answer": self.answer, "verifier": self.verifier.to_json(),
                "tools": list(self.tools), "files": self.files, "metadata": self.metadata,
                "rollout_id": self.rollout_id}


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def load_tasks(path: str | Path) -> list[Task]:
    """Every task of the JSONL file at ``path``, in file order; ``TaskError`` at the first invalid row."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")  # a BOM from an editor is not part of the first row
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskError(f"{path}: cannot read the task file ({exc}). Fix: pass a readable UTF-8 JSONL file") from exc
    tasks: list[Task] = []
    ids: dict[str | None, int] = {}  # value -> the line it was first seen on
    rollout_ids: dict[str | None, int] = {}
    # Split on "\n" only: str.splitlines would also split on U+2028 etc., which JSON strings may hold raw.
    for number, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue
        loc = f"{path}:{number}"
        task = _task(loc, number, _parse(loc, raw))
        for value, seen, what in ((task.id, ids, "id"), (task.rollout_id, rollout_ids, "_ng_rollout_id")):
            if value is not None and value in seen:
                raise _fail(loc, what, value, f"repeats line {seen[value]} ({path}:{seen[value]})",
                            f"give every task its own {what}")
            seen.setdefault(value, number)
        tasks.append(task)
    if not tasks:
        raise TaskError(f"{path}: the task file has no tasks. Fix: write one JSON object per line "
                        '(e.g. {"id": "t1", "prompt": "What is 2+2?", "answer": 4})')
    return tasks


def tasks_digest(tasks: list[Task]) -> str:
    """Hex SHA-256 of the tasks' canonical JSON; the same task set gives the same digest in every process."""
    body = [task.to_json() for task in sorted(tasks, key=lambda t: t.id)]
    blob = json.dumps({"tokentrail_tasks": 1, "tasks": body}, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def _parse(loc: str, raw: str) -> dict[str, Any]:
    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        twice = [key for key, count in Counter(key for key, _ in pairs).items() if count > 1]
        if twice:
            raise TaskError(f"{loc}: key {twice[0]!r} appears twice in one object. Fix: keep one of them")
        return dict(pairs)

    try:
        row = json.loads(raw, object_pairs_hook=unique)
        json.dumps(row, allow_nan=False)  # NaN, Infinity and numbers like 1e400 (read as infinity) are refused
    except json.JSONDecodeError as exc:
        raise TaskError(f"{loc}: invalid JSON ({exc.msg} at column {exc.colno}) in {shown(raw.strip())}. "
                        "Fix: write one complete JSON object per line") from exc
    except ValueError as exc:
        raise TaskError(f"{loc}: the row holds NaN or an infinite number ({exc}). Fix: write finite numbers") from exc
    except RecursionError as exc:
        raise TaskError(f"{loc}: the row nests too deeply to read. Fix: flatten it") from exc
    if not isinstance(row, dict):
        raise TaskError(f"{loc}: a row must be a JSON object, got {shown(row)}. "
                        'Fix: write {"id": ..., "prompt": ..., "answer": ...}')
    return row


def _task(loc: str, line: int, row: dict[str, Any]) -> Task:
    if "responses_create_params" in row:
        fields = _gym_fields(loc, line, row)
    else:
        unknown = sorted(set(row) - set(_NATIVE_KEYS))
        if unknown:
            raise TaskError(f"{loc}: unknown field(s) {', '.join(map(repr, unknown))}. Fix: use only "
                            f"{', '.join(_NATIVE_KEYS)} (or a NeMo Gym row with responses_create_params)")
        missing = [key for key in ("id", "prompt", "answer") if key not in row]
        if missing:
            raise TaskError(f"{loc}: field {missing[0]!r} is missing. Fix: every row needs id, prompt and answer")
        fields = dict(row, metadata=_object(loc, "metadata", row.get("metadata")))
    task_id, prompt = fields["id"], fields["prompt"]
    if not isinstance(prompt, str) or not prompt.strip():
        raise _fail(loc, "prompt", prompt, "must be a non-empty string", "give the task's question")
    if not isinstance(task_id, str) or not _TASK_ID.fullmatch(task_id):
        raise _fail(loc, "id", task_id, f"must be a string matching {TASK_ID_RULE} (a letter or digit, then "
                    "letters, digits, '.', '_' or '-'; at most 64; rollout ids are built from it)",
                    "rename it, e.g. 'arith-001'")
    spec = _spec(loc, fields.get("verifier"), fields.get("choices"), fields["answer"])
    _check_answer(loc, spec, fields["answer"])
    tools = [] if fields.get("tools") is None else fields["tools"]
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise _fail(loc, "tools", tools, "must be a list of function-tool objects", "give a JSON list of objects")
    rollout_id = fields.get("_ng_rollout_id")
    try:
        rollout_id is None or validate_rollout_id(rollout_id)
    except ContractError as exc:
        raise TaskError(f"{loc}: field '_ng_rollout_id': {exc}") from exc
    return Task(id=task_id, prompt=prompt, answer=fields["answer"], verifier=spec, tools=tuple(tools),
                files=_files(loc, fields.get("files")), metadata=fields["metadata"], rollout_id=rollout_id,
                line=line)


def _files(loc: str, value: object) -> dict[str, str]:
    files = _object(loc, "files", value)
    for rel, content in files.items():
        parts = rel.replace("\\", "/").split("/")
        if (not rel or "\x00" in rel or re.match(r"^(?:[/\\]|[A-Za-z]:)", rel) or ".." in parts
                or set(parts) <= {"", "."}):
            raise _fail(loc, "files", rel, "must name paths relative to the working directory "
                        "(no absolute path, no '..')", "name the file relative to it, e.g. 'data/numbers.txt'")
        if not isinstance(content, str):
            raise _fail(loc, "files", {rel: content}, "must map each path to its text (a string)", "give its text")
    return files


def _spec(loc: str, verifier: object, choices: object, answer: object) -> VerifierSpec:
    given: Any = {} if verifier is None else {"kind": verifier} if isinstance(verifier, str) else verifier
    unknown = sorted(set(given) - set(_SPEC_KEYS)) if isinstance(given, dict) else None
    if unknown is None or unknown:
        raise _fail(loc, "verifier", verifier, f"has unknown key(s) {', '.join(map(repr, unknown))}" if unknown
                    else "must be a kind or an object", f"give one of {', '.join(KINDS)}, or an object with only "
                    f"{', '.join(_SPEC_KEYS)}")
    if choices is not None:
        if "choices" in given:
            raise _fail(loc, "choices", choices, "is given twice (row and verifier)", "give choices once")
        given = {**given, "choices": choices}
    kind = given.get("kind")
    if kind is None:  # the default kind follows from what the row gives
        kind = "custom" if "target" in given else "choice" if "choices" in given \
            else "numeric" if _is_number(answer) else "exact"
    if kind not in KINDS:
        raise _fail(loc, "verifier.kind", kind, f"must be one of {', '.join(KINDS)}", "pick one of them")
    stray = sorted(set(given) - {"kind"} - _APPLIES[kind])
    if stray:
        raise _fail(loc, f"verifier.{stray[0]}", given[stray[0]], f"does not apply to the {kind!r} verifier",
                    "remove it, or choose the verifier kind that reads it")
    for key in ("tolerance", "rel_tolerance"):
        value = given.get(key, 0.0)
        if not _is_number(value) or not math.isfinite(value) or value < 0:
            raise _fail(loc, f"verifier.{key}", value, "must be a finite number >= 0", "e.g. 0.01")
    if not isinstance(given.get("case_sensitive", False), bool):
        raise _fail(loc, "verifier.case_sensitive", given["case_sensitive"], "must be true or false", "use a bool")
    options = given.get("choices", [])
    if ((kind == "choice" or "choices" in given) and (not isinstance(options, list) or not 2 <= len(options) <= 26
                                                      or not all(isinstance(o, str) and o.strip() for o in options))):
        raise _fail(loc, "choices", options, "must be a list of 2 to 26 non-empty option texts",
                    'give e.g. ["Paris", "Rome", "Oslo", "Bern"] (lettered A, B, C...)')
    if kind == "choice" and len({_plain(o, False) for o in options}) != len(options):
        raise _fail(loc, "choices", options, "has two equal options", "make every option distinct")
    target = given.get("target")
    if kind == "custom" and (not isinstance(target, str) or not _TARGET.fullmatch(target)):
        raise _fail(loc, "verifier.target", target, "must be 'module:function' for a custom verifier",
                    "e.g. \"mypkg.verifiers:check\" (an importable module and a function of two arguments)")
    return VerifierSpec(kind=kind, tolerance=float(given.get("tolerance", 1e-6)),
                        rel_tolerance=float(given.get("rel_tolerance", 0.0)), choices=tuple(options),
                        target=target, case_sensitive=given.get("case_sensitive", False))


def _plain(text: str, case_sensitive: bool) -> str:
    return " ".join(text.split()) if case_sensitive else " ".join(text.split()).casefold()


def _check_answer(loc: str, spec: VerifierSpec, answer: object) -> None:
    if spec.kind == "custom":
        return  # the custom verifier alone decides what its answer means (None included)
    answers = answer if isinstance(answer, list) else [answer]
    if answer is None or not answers:
        raise _fail(loc, "answer", answer, "is null or an empty list", "give the expected answer or a list of them "
                    "(a NeMo Gym row: verifier_metadata.expected_answer); null only with a custom verifier")
    letters = [chr(ord("A") + i) for i in range(len(spec.choices))]
    options = {_plain(o, spec.case_sensitive) for o in spec.choices}
    for item in answers:
        if spec.kind == "numeric":
            ok = _is_number(item) or (isinstance(item, str) and bool(_NUMBER_TEXT.match(item)))
            want = "a number (or a plain decimal string such as \"12.5\")"
        elif spec.kind == "exact":
            ok, want = _is_number(item) or (isinstance(item, str) and bool(item.strip())), "a non-empty string"
        else:
            text = str(item).strip() if isinstance(item, str) or _is_number(item) else None
            ok = text is not None and (text.upper() in letters or _plain(text, spec.case_sensitive) in options)
            want = f"a letter {letters[0]}-{letters[-1]} or one of the option texts"
        if not ok:
            raise _fail(loc, "answer", answer, f"must be {want}, or a list of them, for the {spec.kind!r} verifier",
                        "correct the answer, or choose the verifier kind that fits it")
