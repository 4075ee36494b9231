"""Reading JSON from outside: bodies that cannot be read, or nest deeper than tokentrail can re-encode.

orjson reads up to 1,024 levels of nesting but writes at most 254, and the interceptor
re-encodes every request it sends upstream (Python's ``json``, used for hashes and the
finish result, gives out near 1,000). A request nested 255..1,024 levels deep would be
accepted and then fail on the way to the engine as if the engine had failed, so it is
refused up front: at most ``MAX_JSON_DEPTH`` levels, which leaves room for the level or
two a dialect translation adds (an Anthropic ``input_schema`` becomes
``function.parameters``).

Every message names where the problem is and what to do about it.
"""

from __future__ import annotations

from typing import Any

import orjson

MAX_JSON_DEPTH = 200
_ORJSON_WRITE_DEPTH = 254  # orjson.dumps raises "Recursion limit reached" above this
_READ_DEPTH = 1024  # orjson.loads raises "depth limit exceeded" above this


def load_json(raw: bytes, what: str) -> Any:
    """The decoded JSON; ValueError saying what is wrong with it otherwise."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if not raw.strip():
            raise ValueError(f"{what} is empty: send a JSON object") from exc
        if "depth limit" in str(exc):
            raise ValueError(f"{what} nests more than {_READ_DEPTH} levels deep ({exc}); tokentrail takes at most "
                             f"{MAX_JSON_DEPTH} levels: flatten the deeply nested field, or send it as a JSON "
                             "string") from exc
        raise ValueError(f"{what} is not valid JSON (UTF-8, finite numbers, no lone surrogates): {exc}") from exc


def nesting_problem(value: Any, what: str = "") -> str | None:
    """None, or a message naming the field of ``value`` that nests deeper than ``MAX_JSON_DEPTH`` levels.

    ``what`` prefixes the field path (e.g. ``"result"``). A top-level object is level 1.
    """
    if not isinstance(value, (dict, list)):
        return None
    try:  # orjson at C speed: wrapped so that it gives out exactly above MAX_JSON_DEPTH
        wrapped: Any = value
        for _ in range(_ORJSON_WRITE_DEPTH - MAX_JSON_DEPTH):
            wrapped = [wrapped]
        orjson.dumps(wrapped)
        return None
    except TypeError as exc:
        if "Recursion limit" not in str(exc):
            return None  # not a depth problem (orjson-decoded values always encode otherwise)
    path = _too_deep(value)
    if path is None:  # pragma: no cover - orjson and the walk agree
        return None
    field = _format_path(path, what)
    return (f"{field} nests more than {MAX_JSON_DEPTH} levels deep; tokentrail takes at most {MAX_JSON_DEPTH} "
            f"(orjson, which re-encodes it, writes at most {_ORJSON_WRITE_DEPTH}): flatten it, or "
            "send it as a JSON string")


def _too_deep(value: Any) -> list[Any] | None:
    """The path (keys and indexes) to the first container deeper than MAX_JSON_DEPTH, or None."""
    stack: list[tuple[Any, int, Any]] = [(value, 1, None)]  # (container, its level, (key, parent link))
    while stack:
        node, level, link = stack.pop()
        if level > MAX_JSON_DEPTH:
            path: list[Any] = []
            while link is not None:
                key, link = link
                path.append(key)
            return path[::-1]
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, child in items:
            if isinstance(child, (dict, list)):
                stack.append((child, level + 1, (key, link)))
    return None


def _format_path(path: list[Any], what: str) -> str:
    shown = what
    for key in path[:6]:
        shown += f"[{key}]" if isinstance(key, int) else (f".{key}" if shown else str(key))
    if len(path) > 6:
        shown += "..."
    return f"field '{shown}'" if shown else "the JSON value"
