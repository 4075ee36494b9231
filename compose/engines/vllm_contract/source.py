"""Read vLLM's request/response model classes out of their source text, with ``ast`` (vLLM is never imported).

``read_module(path, text)`` returns, for one source file, every class (its bases, its kind, its
fields in declaration order, its enum members) and every module-level type alias. A field
records what the wire contract depends on:

* ``annotation``: the annotation as source text (``ast.unparse``), e.g. ``list[int] | None``;
* ``required``: no default (a bare annotation, ``Field(...)`` or ``Field(..., ...)``);
* ``default``: the default as JSON when it is a literal, ``{"factory": text}`` for a
  ``default_factory``, ``{"expr": text}`` for anything else;
* ``omitted_when_none``: ``Field(exclude_if=lambda v: v is None)``: the key is left out of
  the JSON when the value is None (pydantic 2.11+), where other fields are sent as ``null``;
* ``excluded``: ``Field(exclude=True)``: never in the JSON (an internal field);
* ``alias`` when the field has one.

``ClassVar`` annotations and ``PrivateAttr`` / ``PrivateAttr()`` values are not fields. A
pydantic ``model_serializer`` that pops keys (``data.pop("tool_calls", None)``) is recorded
as ``serializer_drops``: those keys may be absent from a dump. ``model_config =
ConfigDict(extra=...)`` is recorded as ``extra``.

Guarantees: pure (stdlib only), deterministic for a given text, and it never guesses: a
construct it does not understand is recorded as text (``{"expr": ...}``), not interpreted.
"""

from __future__ import annotations

import ast
from typing import Any

from schemas.errors import TokentrailError


class SourceReadError(TokentrailError):
    """A source file could not be read as Python, or a named class is not in it."""


_MODEL_BASES = {"BaseModel", "OpenAIBaseModel"}
_ENUM_BASES = {"Enum", "StrEnum", "IntEnum", "enum.Enum", "enum.StrEnum", "enum.IntEnum"}


def read_module(path: str, text: str) -> dict[str, Any]:
    """``{"classes": {name: class}, "aliases": {name: text}, "imports": {name: dotted}}`` of one file."""
    try:
        tree = ast.parse(text, filename=path)
    except SyntaxError as exc:
        raise SourceReadError(f"{path}: not Python source ({exc}); is the wheel a vLLM wheel?") from exc
    classes: dict[str, Any] = {}
    aliases: dict[str, str] = {}
    imports: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            classes[node.name] = _class(path, node)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            if ast.unparse(node.annotation).endswith("TypeAlias"):
                aliases[node.target.id] = ast.unparse(node.value)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if _is_type_expr(node.value):
                aliases[node.targets[0].id] = ast.unparse(node.value)
        elif isinstance(node, ast.ImportFrom) and node.module:
            for name in node.names:
                imports[name.asname or name.name] = f"{node.module}.{name.name}"
    return {"classes": classes, "aliases": aliases, "imports": imports}


def _is_type_expr(node: ast.expr) -> bool:
    """A module-level value that is a type: ``Literal[...]``, ``Annotated[...]``, ``A | B``, ``Union[...]``."""
    if isinstance(node, ast.Subscript):
        return ast.unparse(node.value).split(".")[-1] in {"Literal", "Annotated", "Union", "Optional"}
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return True
    return False


def _class(path: str, node: ast.ClassDef) -> dict[str, Any]:
    bases = [ast.unparse(b) for b in node.bases]
    decorators = [ast.unparse(d).split("(")[0] for d in node.decorator_list]
    kind = _kind(bases, decorators)
    out: dict[str, Any] = {"source": f"{path}:{node.lineno}", "bases": bases, "kind": kind, "fields": {}}
    for item in node.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            annotation = ast.unparse(item.annotation)
            if annotation.startswith(("ClassVar", "typing.ClassVar")) or _is_private(item.value):
                continue
            if item.target.id == "model_config":
                continue
            out["fields"][item.target.id] = _field(annotation, item.value)
        elif isinstance(item, ast.Assign) and len(item.targets) == 1 and isinstance(item.targets[0], ast.Name):
            name = item.targets[0].id
            if name == "model_config":
                extra = _keyword(item.value, "extra")
                if extra is not None:
                    out["extra"] = _literal(extra)
            elif kind == "enum":
                out.setdefault("members", {})[name] = _literal(item.value)
        elif isinstance(item, ast.FunctionDef) and any("model_serializer" in ast.unparse(d) for d in item.decorator_list):
            drops = sorted({_pop_key(call) for call in ast.walk(item) if _pop_key(call)})
            out["serializer_drops"] = drops
    return out


def _kind(bases: list[str], decorators: list[str]) -> str:
    if any(b in _ENUM_BASES for b in bases):
        return "enum"
    if any(d.split(".")[-1] == "dataclass" for d in decorators):
        return "dataclass"
    if any(b.split(".")[-1] == "Struct" for b in bases):
        return "msgspec"
    if any(b in _MODEL_BASES for b in bases):
        return "pydantic"
    return "class"  # a subclass of another class read here: ``flatten`` resolves its kind


def _is_private(value: ast.expr | None) -> bool:
    return value is not None and ast.unparse(value).split("(")[0].endswith("PrivateAttr")


def _keyword(value: ast.expr, name: str) -> ast.expr | None:
    if isinstance(value, ast.Call):
        for kw in value.keywords:
            if kw.arg == name:
                return kw.value
    return None


def _literal(node: ast.expr) -> Any:
    try:
        value = ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return {"expr": ast.unparse(node)}
    if isinstance(value, (tuple, set, frozenset)):
        value = list(value)
    return value


def _field(annotation: str, value: ast.expr | None) -> dict[str, Any]:
    out: dict[str, Any] = {"annotation": annotation}
    if value is None:
        out["required"] = True
        return out
    call_name = ast.unparse(value.func).split(".")[-1] if isinstance(value, ast.Call) else ""
    if call_name not in ("Field", "field"):
        out["default"] = _literal(value)
        return out
    assert isinstance(value, ast.Call)
    default = _keyword(value, "default")
    if default is None and value.args:
        default = value.args[0]
    factory = _keyword(value, "default_factory")
    if factory is not None:
        out["default"] = {"factory": ast.unparse(factory)}
    elif default is None or (isinstance(default, ast.Constant) and default.value is Ellipsis):
        out["required"] = True
    else:
        out["default"] = _literal(default)
    exclude_if = _keyword(value, "exclude_if")
    if exclude_if is not None:
        out["exclude_if"] = ast.unparse(exclude_if)
        out["omitted_when_none"] = _is_none_test(exclude_if)
    exclude = _keyword(value, "exclude")
    if isinstance(exclude, ast.Constant) and exclude.value is True:
        out["excluded"] = True  # never serialised
    alias = _keyword(value, "alias")
    if alias is not None:
        out["alias"] = _literal(alias)
    return out


def _is_none_test(node: ast.expr) -> bool:
    """``lambda v: v is None``."""
    if not isinstance(node, ast.Lambda) or len(node.args.args) != 1:
        return False
    body, arg = node.body, node.args.args[0].arg
    return (isinstance(body, ast.Compare) and isinstance(body.left, ast.Name) and body.left.id == arg
            and len(body.ops) == 1 and isinstance(body.ops[0], ast.Is)
            and isinstance(body.comparators[0], ast.Constant) and body.comparators[0].value is None)


def _pop_key(node: ast.AST) -> str:
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "pop"
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        return node.args[0].value
    return ""


def flatten(classes: dict[str, Any]) -> None:
    """Resolve inheritance among ``classes`` in place: fields of bases first (a subclass overrides),
    ``extra`` and ``kind`` inherited, and ``inherits`` naming the bases read here."""
    done: set[str] = set()

    def resolve(name: str, seen: tuple[str, ...] = ()) -> dict[str, Any]:
        cls = classes[name]
        if name in done or name in seen:
            return cls
        fields: dict[str, Any] = {}
        inherited = []
        for base in cls["bases"]:
            if base in classes and base != name:
                parent = resolve(base, seen + (name,))
                inherited.append(base)
                fields.update(parent["fields"])
                if "extra" in parent and "extra" not in cls:
                    cls["extra"] = parent["extra"]
                if cls["kind"] == "class":
                    cls["kind"] = parent["kind"]
                if "serializer_drops" in parent and "serializer_drops" not in cls:
                    cls["serializer_drops"] = parent["serializer_drops"]
        fields.update(cls["fields"])
        cls["fields"] = fields
        if inherited:
            cls["inherits"] = inherited
        done.add(name)
        return cls

    for name in list(classes):
        resolve(name)
