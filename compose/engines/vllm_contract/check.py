"""Check JSON values against a vLLM release's models, as described by ``vllm-<version>.json`` (pure, stdlib only).

``Contract(description).problems(value, model, mode)`` lists what in ``value`` the release
would not send or take as ``model`` (a class of the description, or a union such as
``"A | B"``), one message per problem naming the path, the field, the value and the fix;
``[]`` means it fits. Modes say how the release produced (or reads) the JSON:

* ``request``: what vLLM parses. Every key must be a field (vLLM's models allow extras and
  drop them silently, so an unknown key is a field tokentrail sends for nothing); required
  fields present; every value of a type the annotation accepts.
* ``dump``: a ``model_dump()`` answer. Every key a field; every field present, except those
  the release leaves out (``omitted_when_none`` when None, ``serializer_drops``, msgspec
  structs' defaults); an ``omitted_when_none`` field is never ``null``.
* ``chunk``: a ``model_dump_json(exclude_unset=True)`` stream chunk: keys are fields, present
  as set (no completeness), ``omitted_when_none`` never ``null``.
* ``exclude_none``: as ``chunk``, and no ``null`` anywhere (the usage chunk, checkpoint state).

Types are read from the annotation text: ``int`` (not bool), ``float`` (int or float),
``str``, ``bool``, ``None``, ``X | Y``, ``Optional``, ``list``/``tuple``/``set``, ``dict``
(JSON keys; ``int`` keys as decimal strings), ``Literal``, ``Annotated[X, ...]`` as X
(constraints are not checked), the description's classes, enums and aliases. A name the
description leaves opaque (a type from outside vLLM, e.g. the OpenAI SDK's message params)
accepts any value: the description lists those names under ``opaque``.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from typing import Any

from schemas.errors import TokentrailError

MODES = ("request", "dump", "chunk", "exclude_none")


class ContractCheckError(TokentrailError):
    """The check itself was misused: an unknown model, mode or annotation."""


@lru_cache(maxsize=1024)
def _parse(text: str) -> ast.expr:
    try:
        return ast.parse(text, mode="eval").body
    except SyntaxError as exc:
        raise ContractCheckError(f"annotation {text!r} is not a Python expression ({exc})") from exc


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class Contract:
    """One release's description, ready to check values against."""

    def __init__(self, description: dict[str, Any]) -> None:
        self.version = description["vllm"]["version"]
        self.classes: dict[str, Any] = description["classes"]
        self.aliases: dict[str, str] = description["aliases"]
        self.opaque: dict[str, str] = description["opaque"]

    def problems(self, value: Any, model: str, mode: str, path: str = "$") -> list[str]:
        if mode not in MODES:
            raise ContractCheckError(f"mode {mode!r}: use one of {', '.join(MODES)}")
        for name in (n.strip() for n in model.split("|")):
            if name not in self.classes:
                raise ContractCheckError(f"model {name!r} is not in the vLLM {self.version} description; regenerate "
                                         f"it with that class in compose/engines/vllm_contract/generate.py SOURCES")
        return self._type(value, _parse(model), mode, path)

    # -- types ------------------------------------------------------------------------

    def _type(self, value: Any, node: ast.expr, mode: str, path: str) -> list[str]:
        if isinstance(node, ast.Constant) and node.value is None:
            return [] if value is None else [f"{path}: {_show(value)} where vLLM {self.version} has only null"]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return self._union(value, [node.left, node.right], mode, path)
        if isinstance(node, ast.Subscript):
            return self._generic(value, node, mode, path)
        if isinstance(node, ast.Attribute):
            return []  # a qualified name from outside the description (e.g. np.ndarray): opaque
        if isinstance(node, ast.Name):
            return self._named(value, node.id, mode, path)
        raise ContractCheckError(f"{path}: cannot read the annotation {ast.unparse(node)!r}")

    def _union(self, value: Any, options: list[ast.expr], mode: str, path: str) -> list[str]:
        flat: list[ast.expr] = []
        while options:
            option = options.pop(0)
            if isinstance(option, ast.BinOp) and isinstance(option.op, ast.BitOr):
                options[:0] = [option.left, option.right]
            else:
                flat.append(option)
        found = [self._type(value, option, mode, path) for option in flat]
        if any(not errors for errors in found):
            return []
        shaped = [errors for errors in found if not errors[0].startswith(f"{path}: {_show(value)} where")]
        if len(shaped) == 1:
            return shaped[0]  # the one option of the value's own kind says best what is wrong
        return [f"{path}: {_show(value)} where vLLM {self.version} has {' | '.join(ast.unparse(o) for o in flat)}"]

    def _generic(self, value: Any, node: ast.Subscript, mode: str, path: str) -> list[str]:
        base = ast.unparse(node.value).split(".")[-1]
        args = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
        expected = f"{path}: {_show(value)} where vLLM {self.version} has {ast.unparse(node)}"
        if base in ("Annotated", "SerializeAsAny"):
            return self._type(value, args[0], mode, path)
        if base == "Optional":
            return [] if value is None else self._type(value, args[0], mode, path)
        if base == "Union":
            return self._union(value, args, mode, path)
        if base == "Literal":
            return [] if any(value == ast.literal_eval(a) and type(value) is type(ast.literal_eval(a))
                             for a in args) else [expected]
        if base in ("list", "List", "Sequence", "set", "frozenset"):
            if not isinstance(value, list):
                return [expected]
            return [e for i, item in enumerate(value) for e in self._type(item, args[0], mode, f"{path}[{i}]")]
        if base in ("tuple", "Tuple"):
            if not isinstance(value, list):
                return [expected]
            if len(args) == 2 and isinstance(args[1], ast.Constant) and args[1].value is Ellipsis:
                args = [args[0]] * len(value)
            if len(args) != len(value):
                return [expected]
            return [e for i, (item, a) in enumerate(zip(value, args)) for e in self._type(item, a, mode, f"{path}[{i}]")]
        if base in ("dict", "Dict", "Mapping"):
            if not isinstance(value, dict):
                return [expected]
            int_keys = ast.unparse(args[0]) == "int"
            bad = [k for k in value if int_keys and not (isinstance(k, str) and k.lstrip("-").isdigit())]
            if bad:
                return [f"{path}: key {bad[0]!r} where vLLM {self.version} has integer keys"]
            return [e for k, v in value.items() for e in self._type(v, args[1], mode, f"{path}[{k!r}]")]
        return self._named(value, base, mode, path)

    def _named(self, value: Any, name: str, mode: str, path: str) -> list[str]:
        expected = f"{path}: {_show(value)} where vLLM {self.version} has {name}"
        if name in ("Any", "object", "JsonValue") or name in self.opaque:
            return []
        if name in self.aliases:
            return self._type(value, _parse(self.aliases[name]), mode, path)
        simple = {"str": str, "bool": bool, "dict": dict, "list": list}
        if name in simple:
            return [] if isinstance(value, simple[name]) else [expected]
        if name in ("int", "NonNegativeInt"):
            ok = isinstance(value, int) and not isinstance(value, bool) and (name == "int" or value >= 0)
            return [] if ok else [expected]
        if name == "float":
            return [] if isinstance(value, (int, float)) and not isinstance(value, bool) else [expected]
        if name in self.classes:
            return self._object(value, name, mode, path)
        raise ContractCheckError(f"{path}: the annotation names {name!r}, which the description neither defines "
                                 f"nor lists as opaque; regenerate the description")

    # -- models ---------------------------------------------------------------------

    def _object(self, value: Any, name: str, mode: str, path: str) -> list[str]:
        cls = self.classes[name]
        if cls["kind"] == "enum":
            members = list(cls.get("members", {}).values())
            return [] if value in members else [f"{path}: {_show(value)} is not a {name} ({members})"]
        if not isinstance(value, dict):
            return [f"{path}: {_show(value)} where vLLM {self.version} has a {name} object"]
        fields: dict[str, Any] = cls["fields"]
        by_key = {f.get("alias", k): f for k, f in fields.items()}
        errors: list[str] = []
        for key, item in value.items():
            field = by_key.get(key)
            where = f"{path}.{key}"
            if field is None:
                errors.append(f"{where}: vLLM {self.version}'s {name} has no field {key!r} "
                              + ("(it would ignore it silently): stop sending it, or use the field it was renamed to"
                                 if mode == "request" else "(a client of that release never sees it): drop it"))
                continue
            if field.get("excluded") and mode != "request":
                errors.append(f"{where}: vLLM {self.version} never sends {name}.{key} (Field(exclude=True)): drop it")
                continue
            if item is None and mode != "request" and (field.get("omitted_when_none") or mode == "exclude_none"):
                why = f"{name}.{key} is excluded when None" if field.get("omitted_when_none") else "no null is sent here"
                errors.append(f"{where}: null, but vLLM {self.version} leaves the key out ({why}): omit it")
                continue
            errors += self._type(item, _parse(field["annotation"]), mode, where)
        for key, field in fields.items():
            if field.get("alias", key) in value:
                continue
            if field.get("required"):
                errors.append(f"{path}: {name} requires {key!r} ({field['annotation']}) in vLLM {self.version}: send it")
            elif mode == "dump" and cls["kind"] in ("pydantic", "dataclass") and not field.get("omitted_when_none") \
                    and not field.get("excluded") and key not in cls.get("serializer_drops", ()):
                errors.append(f"{path}: no {key!r}, which vLLM {self.version}'s {name} always sends "
                              f"(null or its default when unset): add it")
        return errors
