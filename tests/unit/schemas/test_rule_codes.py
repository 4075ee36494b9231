"""Every incomplete reason and mask code has one home: ``schemas.records``' enums.

The scan reads the runtime packages' source (AST, not substrings): a ``MaskReason``,
``CallIncomplete`` or incomplete-call helper built from a bare string literal is a code
that bypassed its enum, and fails here with the file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from consumers.rebuild.trajectory import ChainError
from schemas.records import IncompleteReason, MaskCode

REPO = Path(__file__).resolve().parents[3]
RUNTIME = ("schemas", "producers", "processors", "consumers", "compose")

# call name -> (keyword, positional index) of the code argument
_CODE_ARGS = {
    "MaskReason": ("code", 0),
    "CallIncomplete": ("reason", 0),
    "Attribution": ("failure", None),
    "incomplete_call": ("reason", 1),
    "incomplete": ("reason", 2),  # ProducerCore.incomplete(rollout_id, call_id, reason, ...)
}
# attributes whose assigned value is a code (Attribution.failure, ChainError.code): checked in
# the rebuild only, where those classes live (elsewhere ``failure``/``code`` mean other things)
_CODE_ATTRS = ("failure", "code")
_ATTR_SCOPE = REPO / "consumers" / "rebuild"


def _sources() -> list[Path]:
    return [p for pkg in RUNTIME for p in sorted((REPO / pkg).rglob("*.py"))]


def _name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _literal(node: ast.expr | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _bare_codes(tree: ast.AST, attrs: bool = True) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and (spec := _CODE_ARGS.get(_name(node.func) or "")):
            keyword, index = spec
            args = [k.value for k in node.keywords if k.arg == keyword]
            if index is not None and len(node.args) > index:
                args.append(node.args[index])
            found += [(node.lineno, v) for a in args if (v := _literal(a)) is not None]
        elif attrs and isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for t in (target.elts if isinstance(target, ast.Tuple) else [target]):
                    attr = t.attr if isinstance(t, ast.Attribute) else t.id if isinstance(t, ast.Name) else None
                    if attr not in _CODE_ATTRS:
                        continue
                    value = node.value
                    if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
                        value = value.elts[target.elts.index(t)]
                    if (v := _literal(value)) is not None:
                        found.append((node.lineno, v))
    return found


def test_no_module_builds_a_code_from_a_bare_string():
    bare = [f"{path.relative_to(REPO)}:{line}: {value!r}"
            for path in _sources() if path.name != "records.py" or path.parent.name != "schemas"
            for line, value in _bare_codes(ast.parse(path.read_text(), str(path)),
                                           attrs=path.is_relative_to(_ATTR_SCOPE))]
    assert bare == [], "use the schemas.records.MaskCode / IncompleteReason member:\n" + "\n".join(bare)


def test_the_scan_catches_a_bare_code():
    # The scan above must be able to fail: each shape it looks for is caught here.
    tree = ast.parse(
        'MaskReason(code="x")\nCallIncomplete(reason="y")\ncore.incomplete(r, c, "z", p)\n'
        'incomplete_call(c, "w", route=r)\nout.failure, out.detail = "v", ""\nclass E:\n    code = "u"\n'
    )
    assert sorted(v for _, v in _bare_codes(tree)) == ["u", "v", "w", "x", "y", "z"]


def _chain_errors(cls: type) -> list[type]:
    return [cls, *(s for sub in cls.__subclasses__() for s in _chain_errors(sub))]


@pytest.mark.parametrize("error", _chain_errors(ChainError), ids=lambda c: c.__name__)
def test_chain_errors_become_mask_codes(error):
    assert isinstance(error.code, MaskCode)


@pytest.mark.parametrize("enum", [IncompleteReason, MaskCode])
def test_codes_are_snake_case_wire_strings(enum):
    values = [m.value for m in enum]
    assert len(set(values)) == len(values)
    for member in enum:
        assert member.value == member.name.lower(), f"{enum.__name__}.{member.name} = {member.value!r}"


def test_client_disconnected_is_listed_because_the_interceptor_emits_it():
    # Retired once as never emitted; producers.call.stream records it for a harness that left mid-stream.
    import inspect

    from producers.call import stream as stream_pump

    assert IncompleteReason.CLIENT_DISCONNECTED == "client_disconnected"
    assert "IncompleteReason.CLIENT_DISCONNECTED" in inspect.getsource(stream_pump)
