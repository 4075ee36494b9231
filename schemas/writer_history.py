"""The writer schemas a reader keeps, and the reader schema each archived writer's records resolve to (pure).

Readers keep every writer schema ever released (``schemas/avro/history``, written by
``schemas.archive``; ARCHITECTURE §4). Most old records resolve against the current schema as
Avro's rules say; ``reader_for`` is where a change of wire form needs more than those rules.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

from fastavro.schema import parse_schema

from schemas.wire_kinds import HashBytes

__all__ = ["archived_writers", "reader_for", "schema_dir"]


def schema_dir() -> Any:
    """The package directory of the ``.avsc`` files (and ``history/``)."""
    return resources.files("schemas") / "avro"


def reader_for(writer: Any, current: Any, table: Mapping[type, Mapping[str, Any]]) -> Any:
    """The reader schema for records of an archived ``writer``: ``current``, except that a hash field
    (``HashBytes``) the writer wrote as an Avro string is read as one.

    Avro would promote such a string to ``bytes``, and the 64 ASCII bytes of a hex digest are not
    its 32 raw bytes: reading them as a string gives the value the record holds, unchanged.
    """
    hexed = {cls.__name__: {name for name, kind in kinds.items() if isinstance(kind, HashBytes)}
             for cls, kinds in table.items()}
    written = _record_fields(writer)
    changed = False

    def copy(node: Any) -> Any:
        nonlocal changed
        if isinstance(node, list):
            return [copy(n) for n in node]
        if not isinstance(node, dict):
            return node
        out = {k: copy(v) for k, v in node.items() if not k.startswith("__")}  # fastavro's parse marks
        if out.get("type") == "record":
            short = out["name"].rsplit(".", 1)[-1]
            for f in out["fields"]:
                old = written.get(short, {}).get(f["name"]) if f["name"] in hexed.get(short, ()) else None
                if old == "string" or (isinstance(old, dict) and old.get("items") == "string"):
                    f["type"], changed = old, True
        return out

    reader = copy(current)
    return parse_schema(reader) if changed else current


def _record_fields(schema: Any) -> dict[str, dict[str, Any]]:
    """Every record defined in ``schema``: {short name: {field name: its Avro type}}."""
    found: dict[str, dict[str, Any]] = {}

    def walk(node: Any) -> None:
        if isinstance(node, list):
            for n in node:
                walk(n)
        elif isinstance(node, dict):
            kind = node.get("type")
            if kind == "record":
                found.setdefault(node["name"].rsplit(".", 1)[-1], {f["name"]: f["type"] for f in node["fields"]})
                for f in node["fields"]:
                    walk(f["type"])
            elif kind == "array":
                walk(node["items"])
            elif kind == "map":
                walk(node["values"])
            elif isinstance(kind, (dict, list)):
                walk(kind)

    walk(schema)
    return found


def archived_writers(schema_name: str) -> list[Any]:
    """Every archived writer schema of ``schema_name`` (schemas/avro/history/<name>.*.json)."""
    out = []
    for entry in (schema_dir() / "history").iterdir():
        if entry.name.startswith(f"{schema_name}.") and entry.name.endswith(".json"):
            out.append(parse_schema(json.loads(entry.read_text())))
    return out
