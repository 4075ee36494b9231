"""What the task file's rows are made of besides native tasks: NeMo Gym rows, and the error shapes.

``gym_fields`` reads a NeMo Gym row (``responses_create_params``, ``verifier_metadata``) into the
native field names ``compose.collect.tasks`` checks; nothing a row carries is dropped (what does
not map goes into metadata, a clash is refused). ``TaskError`` and ``field_error`` are the one
shape of a refusal: ``path:line``, the field, the value (``shown``, shortened) and the fix.
"""

from __future__ import annotations

import json
from typing import Any

from schemas.errors import ConfigError

__all__ = ["TaskError", "field_error", "json_object", "gym_fields", "shown"]

_GYM_ANSWER_KEYS = ("expected_answer", "answer", "ground_truth")
# The keys of a Gym row read as task fields; any other key of the row is kept in metadata.
_GYM_OWN = ("id", "responses_create_params", "verifier_metadata", "verifier", "files", "metadata", "_ng_rollout_id")


class TaskError(ConfigError):
    """A task file is unreadable or a row is invalid; the message names path:line, the field and the fix."""


def shown(value: object, limit: int = 60) -> str:
    """A value for an error message: its JSON, cut to ``limit`` characters and the length when longer."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except Exception:  # not JSON (a custom verifier's return value): object's own repr, which cannot fail
        text = object.__repr__(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def field_error(loc: str, field_name: str, value: object, problem: str, fix: str) -> TaskError:
    return TaskError(f"{loc}: field {field_name!r} {problem}, got {shown(value)}. Fix: {fix}")


def json_object(loc: str, name: str, value: object) -> dict:
    if value is not None and not isinstance(value, dict):
        raise field_error(loc, name, value, "must be a JSON object", f"give {name} as {{...}} or leave it out")
    return value or {}


def gym_fields(loc: str, line: int, row: dict[str, Any]) -> dict[str, Any]:
    """A NeMo Gym row in the native field names.

    prompt: ``responses_create_params.input`` (a string, or its last user message's text); tools: its
    ``tools``; answer: ``verifier_metadata``'s ``expected_answer``, else ``answer``, else ``ground_truth``;
    id: the row's, else ``verifier_metadata.id``, else ``row<line>``; ``verifier_metadata.options`` or
    ``choices`` (a list) makes a choice task. The rest of ``verifier_metadata``, the row's other keys
    and ``responses_create_params``' other fields (under that name) go into metadata.
    """
    params = json_object(loc, "responses_create_params", row["responses_create_params"])
    meta = dict(json_object(loc, "verifier_metadata", row.get("verifier_metadata")))
    answer_key = next((k for k in _GYM_ANSWER_KEYS if meta.get(k) is not None), None)
    answer = meta.pop(answer_key) if answer_key else None
    task_id = row["id"] if row.get("id") is not None else meta.pop("id") if meta.get("id") is not None else f"row{line}"
    if isinstance(task_id, int) and not isinstance(task_id, bool):
        task_id = str(task_id)  # Gym data sets number their rows
    if not isinstance(task_id, str):
        raise field_error(loc, "id", task_id, "must be a string or an integer", "give the row an id")
    fields: dict[str, Any] = {"id": task_id, "prompt": _prompt(loc, params.get("input")), "answer": answer,
                              "tools": params.get("tools"), "verifier": row.get("verifier"), "files": row.get("files"),
                              "_ng_rollout_id": row.get("_ng_rollout_id")}
    options_key = next((k for k in ("options", "choices") if isinstance(meta.get(k), list)), None)
    if options_key:
        # Gym's multiple-choice sets write options as ["text", ...] or [{"A": "text"}, ...].
        fields["choices"] = [next(iter(o.values())) if isinstance(o, dict) and len(o) == 1 else o
                             for o in meta.pop(options_key)]
    # What the row carries beyond the task goes into metadata, never dropped; a clash is refused.
    metadata = dict(json_object(loc, "metadata", row.get("metadata")))
    rest = {k: v for k, v in params.items() if k not in ("input", "tools")}
    extra = {k: v for k, v in row.items() if k not in _GYM_OWN}
    for source in (meta, extra, {"responses_create_params": rest} if rest else {}):
        for key, value in source.items():
            if key in metadata:
                raise field_error(loc, key, value, "appears twice (verifier_metadata, metadata or the row)",
                            "keep one of them")
            metadata[key] = value
    fields["metadata"] = metadata
    return fields


def _prompt(loc: str, given: object) -> str:
    value = given
    if isinstance(value, list):  # a conversation: the text of its last user message
        value = next((m for m in reversed(value) if isinstance(m, dict) and m.get("role") == "user"), {}).get("content")
        if isinstance(value, list):
            value = "\n".join(p["text"] for p in value if isinstance(p, dict)
                              and p.get("type") in ("input_text", "text") and isinstance(p.get("text"), str))
    if isinstance(value, str) and value.strip():
        return value
    raise field_error(loc, "responses_create_params.input", given, "must be a string, or a list whose last user message "
                "has text", 'e.g. "What is 2+2?" or [{"role": "user", "content": "What is 2+2?"}]')
