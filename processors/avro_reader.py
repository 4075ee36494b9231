"""A record reader compiled from its Avro schema: straight-line Python that builds the contract record (pure).

``compile_reader(schema_name, named_schemas, cls)`` turns a parsed record
schema (fastavro's ``parse_schema`` output and its named schemas) into a
function ``read(data, view, pos) -> (record, end)`` that reads one Avro body at
``pos`` of ``data`` (``view`` is ``memoryview(data)``) and builds ``cls``
directly, the way ``schemas.codec.from_avro`` would build it from fastavro's
datum: the same conversions (schemas.codec's table: enums, nested records,
lists of records, hashes to their hex), then the record's ``__post_init__`` (the contract's
checks). Two differences, both chosen for the fold's hot path:

- packed arrays (token ids, log-probs, float32 or float64) are read-only
  ``memoryview`` casts over ``data`` instead of lists (``len``, indexing,
  slicing, iteration and ``tolist()`` give the same values), so nothing is
  unpacked or copied;
- fields are set on a new instance one by one (no keyword-argument call).

It only ever accepts what fastavro accepts, with the same values: anything
fastavro reads in a way this reader does not mirror exactly raises
``Unsupported`` instead (a boolean byte other than 0 or 1, a negative or
out-of-range union or enum index, which fastavro wraps like a Python index, a
varint longer than 9 bytes, invalid UTF-8, a truncated body), and so does a
schema whose fields are not exactly the record's. Callers then use the full
decoder, which decides and words the error. The reader is generated source,
kept on the function as ``__source__`` for reading and tests.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Any

from schemas.codec import wire_field_names, with_nested
from schemas.errors import TokentrailError
from schemas.wire_kinds import HashBytes

Reader = Callable[[bytes, memoryview, int], tuple[Any, int]]
_TABLE = with_nested({})  # the contract's conversion table (read only)


class Unsupported(TokentrailError):  # an internal signal: it never escapes processors.decode
    """What this reader does not mirror exactly (or cannot read): use the full decoder."""


def compile_reader(schema_name: str, named: Mapping[str, Any], cls: type) -> Reader:
    """A reader of the named record schema that builds ``cls`` (see the module docstring)."""
    gen = _Generator(named)
    entry = gen.record(schema_name, cls)
    source = "\n".join(gen.lines)
    namespace = dict(gen.globals)
    exec(compile(source, f"<avro reader {schema_name}>", "exec"), namespace)  # our own generated source
    reader: Reader = namespace[entry]
    reader.__source__ = source  # type: ignore[attr-defined]
    return reader


def long_at(data: bytes, pos: int) -> tuple[int, int]:
    """A zig-zag varint of at most 9 bytes at ``pos`` (the one-byte case is inlined by the generated code)."""
    shift = result = 0
    for _ in range(9):
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
    raise Unsupported("varint longer than 9 bytes")


class _Generator:
    def __init__(self, named: Mapping[str, Any]) -> None:
        self.named = named
        self.lines: list[str] = []
        self.globals: dict[str, Any] = {"_long": long_at, "Unsupported": Unsupported, "_new": object.__new__,
                                        "_set": object.__setattr__, "_double": struct.Struct("<d").unpack_from,
                                        "_float": struct.Struct("<f").unpack_from}
        self.records: dict[tuple[str, type], str] = {}
        self.counter = 0

    def _name(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def _const(self, value: Any) -> str:
        name = self._name("_c")
        self.globals[name] = value
        return name

    def record(self, schema_name: str, cls: type) -> str:
        if (schema_name, cls) in self.records:
            return self.records[(schema_name, cls)]
        schema = self.named[schema_name]
        if not isinstance(schema, dict) or schema.get("type") != "record":
            raise Unsupported(f"{schema_name} is not a record")
        if sorted(wire_field_names(cls, _TABLE)) != sorted(f["name"] for f in schema["fields"]):
            raise Unsupported(f"{schema_name}'s fields are not {cls.__name__}'s")
        func = self.records[(schema_name, cls)] = self._name("_read_")
        nested = _TABLE.get(cls, {})
        # Log-probs narrowed to float32 travel in a wire-only field beside the record's own.
        narrow = {kind.narrow_field: (name, kind) for name, kind in nested.items() if hasattr(kind, "narrow_field")}
        body: list[str] = []
        targets: list[tuple[str, str]] = []
        narrow_targets: dict[str, str] = {}
        for i, f in enumerate(schema["fields"]):
            target = f"v{i}"
            if f["name"] in narrow:
                if f["type"] != "bytes":
                    raise Unsupported(f"{f['name']} is not bytes")
                narrow_targets[f["name"]] = target
                body += [*self._span(), f"{target} = view[pos:end]", "pos = end"]
                continue
            targets.append((f["name"], target))
            body += self._value(f["type"], nested.get(f["name"]), target)
        wide_targets = dict(targets)
        for narrow_name, (wide_name, kind) in narrow.items():
            wide, narrowed = wide_targets[wide_name], narrow_targets[narrow_name]
            body += [f"if len({narrowed}):",
                     f"    if len({wide}) or len({narrowed}) % 4:",
                     "        raise Unsupported('log-probs carried twice, or a partial float32')",
                     f"    {wide} = {narrowed}.cast({kind.narrow_typecode!r})"]
        lines = [f"def {func}(data, view, pos):"]
        lines += ["    " + line for line in body]
        lines.append(f"    obj = _new({self._const(cls)})")
        lines += [f"    _set(obj, {name!r}, {target})" for name, target in targets]
        post_init = getattr(cls, "__post_init__", None)
        if post_init is not None:
            lines.append(f"    {self._const(post_init)}(obj)")
        lines += ["    return obj, pos", ""]
        self.lines += lines
        return func

    def _varint(self, target: str) -> list[str]:
        """A zig-zag varint into ``target``: one and two bytes inline, longer ones through ``_long``."""
        return ["b = data[pos]",
                "if b < 128:",
                f"    {target} = (b >> 1) ^ -(b & 1)",
                "    pos += 1",
                "elif data[pos + 1] < 128:",
                "    b = (b & 127) | (data[pos + 1] << 7)",
                f"    {target} = (b >> 1) ^ -(b & 1)",
                "    pos += 2",
                "else:",
                f"    {target}, pos = _long(data, pos)"]

    def _span(self) -> list[str]:
        """The length of a string/bytes value (a varint whose zig-zag is even), checked; ``end`` its end."""
        return [*self._varint("n"),
                "end = pos + n",
                "if n < 0 or end > len(data):", "    raise Unsupported('truncated')"]

    def _value(self, avro: Any, kind: Any, target: str) -> list[str]:
        """Statements that read one value of Avro type ``avro`` into ``target``, converted per ``kind``."""
        if isinstance(avro, list):
            return self._union(avro, kind, target)
        if isinstance(avro, dict):
            avro_type = avro["type"]
            if avro_type == "array":
                return self._array(avro["items"], kind, target)
            if avro_type in ("record", "enum", "fixed"):
                return self._value(avro["name"], kind, target)
            if avro_type == "map":
                raise Unsupported("maps are not read by this reader")
            return self._value(avro_type, kind, target)  # {"type": "string", ...}
        if avro == "null":
            return [f"{target} = None"]
        if avro in ("int", "long"):
            return self._varint(target)
        if avro == "boolean":
            return ["b = data[pos]", "pos += 1", "if b > 1:", "    raise Unsupported('boolean byte')",
                    f"{target} = b == 1"]
        if avro in ("double", "float"):
            size, unpack = (8, "_double") if avro == "double" else (4, "_float")
            return [f"{target} = {unpack}(data, pos)[0]", f"pos += {size}"]
        if avro == "string":
            return ["if data[pos] == 0:",  # the empty string, most of a call's optional facts
                    f"    {target} = ''",
                    "    pos += 1",
                    "else:",
                    *["    " + line for line in (*self._span(), f"{target} = str(view[pos:end], 'utf-8')",
                                                  "pos = end")]]
        if avro == "bytes":
            if kind is not None and hasattr(kind, "typecode"):  # schemas.codec's packed arrays
                return [*self._span(), f"{target} = view[pos:end].cast({kind.typecode!r})", "pos = end"]
            if isinstance(kind, HashBytes) and not kind.many:  # a hash: the record holds its hex
                return [*self._span(), f"{target} = view[pos:end].hex()", "pos = end"]
            return [*self._span(), f"{target} = data[pos:end]", "pos = end"]
        schema = self.named.get(avro)
        if isinstance(schema, dict) and schema.get("type") == "enum":
            symbols = schema["symbols"]
            convert = kind if isinstance(kind, type) and issubclass(kind, StrEnum) else None
            values = [convert(s) if convert else s for s in symbols]
            return [*self._varint("i"), f"if not 0 <= i < {len(values)}:", "    raise Unsupported('enum index')",
                    f"{target} = {self._const(values)}[i]"]
        if isinstance(schema, dict) and schema.get("type") == "record":
            if not isinstance(kind, type):
                raise Unsupported(f"record {avro} has no record class")
            return [f"{target}, pos = {self.record(avro, kind)}(data, view, pos)"]
        raise Unsupported(f"Avro type {avro!r} is not read by this reader")

    def _union(self, branches: list[Any], kind: Any, target: str) -> list[str]:
        lines = [*self._varint("i")]
        for index, branch in enumerate(branches):
            lines.append(f"{'if' if index == 0 else 'elif'} i == {index}:")
            lines += ["    " + line for line in self._value(branch, kind, target)]
        lines += ["else:", "    raise Unsupported('union index')"]
        return lines

    def _array(self, items: Any, kind: Any, target: str) -> list[str]:
        item_kind = kind[0] if isinstance(kind, list) else kind.item if isinstance(kind, HashBytes) else None
        item = self._name("_item_")
        body = self._value(items, item_kind, "value")
        self.lines += [f"def {item}(data, view, pos):", *["    " + line for line in body], "    return value, pos", ""]
        return [f"{target} = []",
                *self._varint("count"),
                "while count:",
                "    if count < 0:",  # a block that says its size in bytes too
                "        count = -count",
                *["        " + line for line in self._varint("size")],
                "    for _ in range(count):",
                f"        value, pos = {item}(data, view, pos)",
                f"        {target}.append(value)",
                *["    " + line for line in self._varint("count")]]
