"""Check values from outside against the field types of a contract record's ``.avsc`` (pure: stdlib only).

fastavro writes some values an Avro field cannot hold without complaint: an ``int``
field takes ``2**31`` or ``True`` or ``1.5`` and writes a varint (or a truncation) that
a conforming reader refuses or reads as something else, so the event is dead-lettered
far from whoever sent it. An edge that takes values from outside (HTTP, CLI, Python
API) checks them here first and refuses them with a ``ContractError`` naming the field,
the value and what the schema holds.

Checked: ``null``, ``boolean``, ``int`` (32-bit), ``long`` (64-bit), ``float`` /
``double`` (a number, not a bool), ``string`` (a ``str`` that encodes as UTF-8: no
lone surrogates), ``bytes``, unions, arrays, maps and enums. Named record types
inside a field are not descended into.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from importlib import resources
from typing import Any

from schemas.errors import ContractError

INT_MIN, INT_MAX = -(2**31), 2**31 - 1
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1


@cache
def record_fields(record: str) -> dict[str, Any]:
    """Field name -> Avro type of ``tokentrail.<record>.avsc``."""
    text = (resources.files("schemas") / "avro" / f"tokentrail.{record}.avsc").read_text()
    return {f["name"]: f["type"] for f in json.loads(text)["fields"]}


def conforms(avro_type: Any, value: Any) -> bool:
    """Whether ``value`` can be written as ``avro_type`` and read back unchanged."""
    if isinstance(avro_type, list):
        return any(conforms(branch, value) for branch in avro_type)
    if isinstance(avro_type, dict):
        kind = avro_type.get("type")
        if kind == "array":
            return isinstance(value, list) and all(conforms(avro_type["items"], v) for v in value)
        if kind == "map":
            return isinstance(value, dict) and all(
                isinstance(k, str) and conforms(avro_type["values"], v) for k, v in value.items())
        if kind == "enum":
            return isinstance(value, str) and value in avro_type.get("symbols", ())
        if kind in _PRIMITIVES:  # {"type": "int", "logicalType": ...}
            return conforms(kind, value)
        return True  # a named record: not descended into
    check = _PRIMITIVES.get(avro_type)
    return True if check is None else check(value)


def describe(avro_type: Any) -> str:
    """What ``avro_type`` holds, in words."""
    if isinstance(avro_type, list):
        return " or ".join(describe(branch) for branch in avro_type)
    if isinstance(avro_type, dict):
        kind = avro_type.get("type")
        if kind == "array":
            return f"a list of {describe(avro_type['items'])}"
        if kind == "map":
            return f"an object whose values are {describe(avro_type['values'])}"
        if kind == "enum":
            return f"one of {', '.join(avro_type.get('symbols', ()))}"
        if kind in _PRIMITIVES:
            return describe(kind)
        return f"a {avro_type.get('name', kind)} record"
    return _WORDS.get(avro_type, str(avro_type))


def check_fields(record: str, values: dict[str, Any]) -> None:
    """Raise ContractError for the first value that the record's schema field cannot hold."""
    fields = record_fields(record)
    for name, value in values.items():
        if name not in fields:
            raise ContractError(f"{record} has no field {name!r} (fields: {', '.join(fields)})")
        avro_type = fields[name]
        if not conforms(avro_type, value):
            allowed = describe(avro_type)
            raise ContractError(
                f"field {name!r} = {_show(value)} cannot be stored: {record}.{name} is Avro "
                f"{json.dumps(avro_type)}, which holds {allowed}; send {allowed}")


def _show(value: Any) -> str:
    text = repr(value)
    shown = text if len(text) <= 80 else text[:77] + "..."
    return f"{shown} ({type(value).__name__})"


def _is_utf8_str(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (e.g. from surrogateescape'd argv)
        return False
    return True


def _int_in(low: int, high: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and low <= v <= high


_PRIMITIVES: dict[str, Callable[[Any], bool]] = {
    "null": lambda v: v is None,
    "boolean": lambda v: isinstance(v, bool),
    "int": _int_in(INT_MIN, INT_MAX),
    "long": _int_in(LONG_MIN, LONG_MAX),
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "double": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "string": _is_utf8_str,
    "bytes": lambda v: isinstance(v, (bytes, bytearray)),
}
_WORDS = {
    "null": "null",
    "boolean": "true or false",
    "int": f"an integer in [{INT_MIN}, {INT_MAX}] (32-bit)",
    "long": f"an integer in [{LONG_MIN}, {LONG_MAX}] (64-bit)",
    "float": "a number",
    "double": "a number",
    "string": "a string (valid UTF-8)",
    "bytes": "bytes",
}
