"""The tools a rollout may use: built-ins confined to its working directory, plus the task's own.

Guarantees:

* A harness reaches only what its rollout may see: every built-in path is resolved
  (symlinks followed) and refused unless it lies inside the rollout's working directory;
  absolute paths, ``..`` escapes and symlinks leading out are refused.
* ``ToolSet.call`` never raises. An unknown tool, argument JSON that does not parse, a
  tool that raises or a path outside the working directory come back as the call's
  output text (``error: ...``): a tool error is the agent's to handle, not a rollout
  failure.
* Task-declared tools are checked when the tool set is built (before any rollout I/O):
  a malformed declaration is a ``ConfigError`` naming the task, the tool and the fix.
* The calculator evaluates arithmetic only (numbers, ``+ - * / // % **``, parentheses,
  unary signs) by walking the ``ast``; nothing is ever ``eval``-ed, and integer results
  are bounded, so no expression can exhaust memory or time.

Task tool implementations (``"impl": "module:function"``) are the task set author's
code and run in the collector's process; they get the working directory and are
trusted to stay in it (the confinement above is the built-ins').
"""

from __future__ import annotations

import ast
import copy
import json
import operator
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from schemas.errors import ConfigError, TokentrailError
from schemas.plugins import load_class

if TYPE_CHECKING:
    from compose.collect.tasks import Task

__all__ = ["ToolSet", "check_task_tools", "BUILTIN_NAMES", "READ_LIMIT_BYTES"]

READ_LIMIT_BYTES = 64 * 1024
_WRITE_LIMIT_BYTES = 1024 * 1024   # a runaway agent must not fill the disk
_LIST_LIMIT = 1000                 # entries; a huge directory would flood the context
_EXPR_LIMIT = 1000                 # characters of a calculator expression
_EXPONENT_LIMIT = 1000
_INT_BITS_LIMIT = 4096             # bounds every integer the calculator builds (time and memory)

# OpenAI's rule for function names; Anthropic's allows the same characters.
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_IMPL_KEYS = ("impl", "output")


class _ToolError(TokentrailError):
    """A built-in refused its arguments; the message goes back to the agent."""


def _builtin(name: str, description: str, required: dict[str, str], optional: dict[str, str] | None = None) -> dict:
    props = {key: {"type": "string", "description": text} for key, text in {**required, **(optional or {})}.items()}
    # strict False: the Responses API defaults to strict, which refuses an optional property (list_files' path).
    return {"type": "function", "name": name, "description": description, "strict": False,
            "parameters": {"type": "object", "properties": props, "required": list(required),
                           "additionalProperties": False}}


_IN_WORKDIR = "relative to the working directory"
_BUILTIN_DEFINITIONS: dict[str, dict[str, Any]] = {d["name"]: d for d in (
    _builtin("read_file", "Read a text file of the working directory (at most 64 KiB are returned).",
             {"path": f"file path {_IN_WORKDIR}"}),
    _builtin("list_files", "List a directory of the working directory: sorted names, directories end in /.",
             {}, {"path": f"directory {_IN_WORKDIR} (default .)"}),
    _builtin("write_file", "Write a text file in the working directory (parent directories are created).",
             {"path": f"file path {_IN_WORKDIR}", "content": "the file's full new text"}),
    _builtin("calculator", "Evaluate arithmetic: numbers, + - * / // % **, parentheses, unary minus.",
             {"expression": "e.g. (1 + 2) * 3 ** 2"}),
)}
BUILTIN_NAMES = tuple(_BUILTIN_DEFINITIONS)


def _string_arg(arguments: Mapping[str, Any], key: str, default: str | None = None) -> str:
    value = arguments.get(key, default)
    if not isinstance(value, str):
        raise _ToolError(f"argument {key!r} must be a string, got {'nothing' if value is None else repr(value)}")
    return value


def _confine(workdir: Path, path: str) -> Path:
    """``path`` resolved inside ``workdir``, or a refusal; symlinks are followed before the check."""
    if not path or "\x00" in path:
        raise _ToolError(f"path {path!r} is empty or not a valid path")
    if os.path.isabs(path) or path.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", path):
        raise _ToolError(f"path {path!r} is absolute; give a path relative to the working directory")
    try:
        resolved = (workdir / path).resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop, a name too long
        raise _ToolError(f"path {path!r} cannot be resolved: {exc}") from exc
    if not resolved.is_relative_to(workdir):
        raise _ToolError(f"path {path!r} leads outside the working directory; only files inside it can be used")
    return resolved


def _read_file(arguments: Mapping[str, Any], workdir: Path) -> str:
    path = _string_arg(arguments, "path")
    target = _confine(workdir, path)
    if not target.is_file():  # a FIFO or a device would block or never end
        raise _ToolError(f"{path!r} is a directory; use list_files" if target.is_dir() else
                         f"{path!r} is not a regular file" if target.exists() else f"{path!r} does not exist")
    try:
        with target.open("rb") as fh:
            data = fh.read(READ_LIMIT_BYTES + 1)
        size = target.stat().st_size
    except OSError as exc:
        raise _ToolError(f"cannot read {path!r}: {exc.strerror or exc}") from exc
    text = data[:READ_LIMIT_BYTES].decode("utf-8", errors="replace")
    if len(data) > READ_LIMIT_BYTES:
        text += f"\n[truncated: {path} is {size} bytes; only the first {READ_LIMIT_BYTES} are shown]"
    return text


def _list_files(arguments: Mapping[str, Any], workdir: Path) -> str:
    path = _string_arg(arguments, "path", ".")
    target = _confine(workdir, path or ".")
    if not target.is_dir():
        raise _ToolError(f"{path!r} is not a directory" + ("" if target.exists() else " (it does not exist)"))
    try:
        names = sorted(entry.name + ("/" if entry.is_dir() else "") for entry in target.iterdir())
    except OSError as exc:
        raise _ToolError(f"cannot list {path!r}: {exc.strerror or exc}") from exc
    if len(names) > _LIST_LIMIT:
        names = names[:_LIST_LIMIT] + [f"[... {len(names) - _LIST_LIMIT} more entries not shown]"]
    return "\n".join(names)


def _write_file(arguments: Mapping[str, Any], workdir: Path) -> str:
    path, content = _string_arg(arguments, "path"), _string_arg(arguments, "content")
    data = content.encode("utf-8")
    if len(data) > _WRITE_LIMIT_BYTES:
        raise _ToolError(f"content is {len(data)} bytes; at most {_WRITE_LIMIT_BYTES} can be written")
    target = _confine(workdir, path)
    if target.is_dir():
        raise _ToolError(f"{path!r} is a directory")
    try:
        # Parents of a confined path lie between it and the working directory: inside.
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    except OSError as exc:
        raise _ToolError(f"cannot write {path!r}: {exc.strerror or exc}") from exc
    return f"wrote {len(data)} bytes to {path}"


_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}


def _bounded(value: Any) -> int | float:
    if isinstance(value, int) and value.bit_length() > _INT_BITS_LIMIT:
        raise _ToolError(f"result exceeds {_INT_BITS_LIMIT} bits; the calculator bounds integer size")
    if not isinstance(value, (int, float)):  # e.g. (-8) ** 0.5 is complex
        raise _ToolError("result is not a real number")
    return value


def _check_growth(op: ast.operator, left: int | float, right: int | float) -> None:
    """Refuse, before computing it, a power or product too big to build (``9 ** 999 ** 2``)."""
    if isinstance(op, ast.Pow) and abs(right) > _EXPONENT_LIMIT:
        raise _ToolError(f"exponent {right} is out of range (at most {_EXPONENT_LIMIT} in magnitude)")
    if not (isinstance(left, int) and isinstance(right, int)):
        return  # float arithmetic cannot grow: it overflows (an error) or gives inf
    if isinstance(op, ast.Pow) and right > 0:
        bits = left.bit_length() * right
    elif isinstance(op, ast.Mult):
        bits = left.bit_length() + right.bit_length() - 1
    else:
        return
    if bits > _INT_BITS_LIMIT:
        raise _ToolError(f"result exceeds {_INT_BITS_LIMIT} bits; the calculator bounds integer size")


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        _check_growth(node.op, left, right)
        return _bounded(_BINARY[type(node.op)](left, right))
    what = type(node.op).__name__ if isinstance(node, (ast.BinOp, ast.UnaryOp)) else type(node).__name__
    raise _ToolError(f"{what} is not allowed; only numbers, + - * / // % **, parentheses and unary minus")


def _calculator(arguments: Mapping[str, Any], workdir: Path) -> str:
    expression = _string_arg(arguments, "expression")
    if len(expression) > _EXPR_LIMIT:
        raise _ToolError(f"expression is {len(expression)} characters; at most {_EXPR_LIMIT}")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise _ToolError(f"cannot parse {expression!r}: {getattr(exc, 'msg', exc)}") from exc
    try:
        return str(_evaluate(tree))
    except (ZeroDivisionError, OverflowError, RecursionError) as exc:
        raise _ToolError(f"{expression!r}: {type(exc).__name__}: {exc}") from exc


_BUILTIN_IMPLEMENTATIONS: dict[str, Callable[[Mapping[str, Any], Path], str]] = {
    "read_file": _read_file, "list_files": _list_files, "write_file": _write_file, "calculator": _calculator,
}


@dataclass(frozen=True, slots=True)
class _Tool:
    definition: dict[str, Any]  # Responses function-tool form, without impl/output
    run: Callable[[dict[str, Any], Path], Any]


def check_task_tools(tools: Sequence[Mapping[str, Any]], where: str) -> None:
    """Refuse malformed task tool declarations with a ``ConfigError`` naming ``where`` (the task) and the tool."""
    _compile_task_tools(tools, where)


def _compile_task_tools(tools: Sequence[Mapping[str, Any]], where: str) -> dict[str, _Tool]:
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise ConfigError(f"{where}: tools must be a list of function tool objects, got {type(tools).__name__}")
    compiled: dict[str, _Tool] = {}
    for index, spec in enumerate(tools):
        if not isinstance(spec, Mapping):
            raise ConfigError(f"{where}: tools[{index}] must be an object like "
                              f'{{"type": "function", "name": ..., "output": ...}}, got {type(spec).__name__}')
        name = spec.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise ConfigError(f"{where}: tools[{index}]: name {name!r} must be 1-64 letters, digits, '_' or '-'")
        label = f"{where}: tool {name!r}"
        if spec.get("type") != "function":
            raise ConfigError(f"{label}: type {spec.get('type')!r} must be 'function'")
        if name in _BUILTIN_DEFINITIONS:
            raise ConfigError(f"{label} shadows the built-in tool of that name; rename it "
                              f"(built-ins: {', '.join(BUILTIN_NAMES)})")
        if name in compiled:
            raise ConfigError(f"{label} is declared twice; tool names must be unique within a task")
        description = spec.get("description", "")
        if not isinstance(description, str):
            raise ConfigError(f"{label}: description must be a string, got {type(description).__name__}")
        parameters = spec.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, Mapping) or parameters.get("type") != "object":
            raise ConfigError(f"{label}: parameters {parameters!r} must be a JSON schema with "
                              f'"type": "object" (arguments are a JSON object)')
        present = [key for key in _IMPL_KEYS if key in spec]
        if len(present) != 1:
            found = "both impl and output" if present else "neither impl nor output"
            raise ConfigError(f'{label} has {found}; give exactly one of "impl": "module:function" '
                              f'or "output": "<static text>"')
        definition = {k: copy.deepcopy(v) for k, v in spec.items() if k not in _IMPL_KEYS}
        definition.update(description=description, parameters=copy.deepcopy(dict(parameters)))
        compiled[name] = _Tool(definition, _implementation(spec, label))
    return compiled


def _implementation(spec: Mapping[str, Any], label: str) -> Callable[[dict[str, Any], Path], Any]:
    if "output" in spec:
        text = spec["output"]
        if not isinstance(text, str):
            raise ConfigError(f"{label}: output must be a string (the tool's fixed result), got {type(text).__name__}")
        return lambda arguments, workdir: text
    target = spec["impl"]
    if not isinstance(target, str):
        raise ConfigError(f"{label}: impl {target!r} must be a 'module:function' string")
    try:
        fn = load_class(target, "task tool")
    except ConfigError as exc:
        raise ConfigError(f"{label}: {exc}") from exc
    if not callable(fn):
        raise ConfigError(f"{label}: impl {target!r} is a {type(fn).__name__}, not a function "
                          f"fn(arguments: dict, workdir: Path) -> str")
    return fn


class ToolSet:
    """The tools of one rollout: built-ins confined to ``workdir`` (unless ``builtins=False``) and the task's."""

    def __init__(self, workdir: Path, task_tools: Sequence[Mapping[str, Any]] = (), builtins: bool = True,
                 *, where: str = "task tools") -> None:
        if not Path(workdir).is_dir():
            raise ConfigError(f"tool working directory {str(workdir)!r} is not a directory; create it first")
        # Resolved once: every confinement check compares real paths.
        self._workdir = Path(workdir).resolve()
        self._tools: dict[str, _Tool] = {name: _Tool(definition, _BUILTIN_IMPLEMENTATIONS[name]) for name, definition
                                         in _BUILTIN_DEFINITIONS.items()} if builtins else {}
        self._tools.update(_compile_task_tools(task_tools, where))

    @classmethod
    def for_task(cls, task: Task, workdir: Path, *, builtins: bool = True) -> ToolSet:
        """The tool set of ``task``'s rollout in ``workdir``; a malformed task tool is a ``ConfigError`` naming it."""
        return cls(workdir, task.tools or (), builtins, where=f"task {task.id!r}")

    @property
    def workdir(self) -> Path:
        return self._workdir

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._tools)

    def definitions(self) -> list[dict[str, Any]]:
        """Responses API function-tool definitions (copies: a caller may change them freely)."""
        return [copy.deepcopy(tool.definition) for tool in self._tools.values()]

    def chat_tools(self) -> list[dict[str, Any]]:
        """The same tools in the chat-completions form ``{"type": "function", "function": {...}}``."""
        out = []
        for d in self.definitions():
            function = {"name": d["name"], "description": d["description"], "parameters": d["parameters"]}
            if "strict" in d:
                function["strict"] = d["strict"]
            out.append({"type": "function", "function": function})
        return out

    def anthropic_tools(self) -> list[dict[str, Any]]:
        """The same tools in Anthropic's Messages form ``{"name", "description", "input_schema"}``."""
        return [{"name": d["name"], "description": d["description"], "input_schema": d["parameters"]}
                for d in self.definitions()]

    def call(self, name: str, arguments: str | Mapping[str, Any]) -> str:
        """Run tool ``name``: its result, or ``error: ...`` text. Never raises."""
        tool = self._tools.get(name) if isinstance(name, str) else None
        if tool is None:
            return f"error: unknown tool {name!r}; available: {', '.join(self._tools) or '(none)'}"
        if isinstance(arguments, (str, bytes)):
            try:
                # Models often send "" for a tool without parameters.
                arguments = json.loads(arguments) if arguments.strip() else {}
            except (ValueError, RecursionError) as exc:
                return f"error: arguments for {name!r} are not valid JSON ({exc}); send a JSON object"
        if not isinstance(arguments, Mapping):
            return f"error: arguments for {name!r} must be a JSON object, got {type(arguments).__name__}"
        try:
            result = tool.run(dict(arguments), self._workdir)
        except _ToolError as exc:
            return f"error: {name}: {exc}"
        except (Exception, SystemExit) as exc:  # a task tool's bug must not end the rollout
            return f"error: tool {name!r} raised {type(exc).__name__}: {exc}"
        if not isinstance(result, str):
            return f"error: tool {name!r} returned {type(result).__name__}, not str (fix the tool's implementation)"
        return result
