"""The rollout tool set: confinement, calculator safety, task tools, start-up validation, never raising."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compose.collect.tools import BUILTIN_NAMES, READ_LIMIT_BYTES, ToolSet, check_task_tools
from schemas.errors import ConfigError, TokentrailError


@dataclass(frozen=True)
class FakeTask:
    id: str
    prompt: str = "p"
    tools: tuple[dict, ...] = ()
    files: dict = field(default_factory=dict)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    root = tmp_path / "work"
    (root / "sub").mkdir(parents=True)
    (root / "numbers.txt").write_text("1\n2\n3\n")
    (root / "sub" / "inner.txt").write_text("inner")
    (tmp_path / "secret.txt").write_text("top secret")
    return root


@pytest.fixture(scope="session")
def impl_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An importable module of task tool implementations; its name."""
    root = tmp_path_factory.mktemp("impls")
    (root / "tt_test_task_tools.py").write_text(textwrap.dedent("""
        CALLS = []
        NOT_CALLABLE = 42

        def lookup(arguments, workdir):
            CALLS.append((arguments, workdir))
            return f"{arguments['key']}=" + (workdir / "numbers.txt").read_text().split()[0]

        def boom(arguments, workdir):
            raise ValueError("kaput")

        def exits(arguments, workdir):
            raise SystemExit(3)

        def not_text(arguments, workdir):
            return 7
    """))
    sys.path.insert(0, str(root))
    yield "tt_test_task_tools"
    sys.path.remove(str(root))
    sys.modules.pop("tt_test_task_tools", None)


def tool(name: str, **extra) -> dict:
    return {"type": "function", "name": name, "description": f"the {name} tool",
            "parameters": {"type": "object", "properties": {"key": {"type": "string"}}}, **extra}


# -- built-ins and confinement -----------------------------------------------------------------

def test_read_list_write_inside_the_workdir(workdir: Path):
    tools = ToolSet(workdir)
    assert tools.call("list_files", {}) == "numbers.txt\nsub/"
    assert tools.call("list_files", '{"path": "sub"}') == "inner.txt"
    assert tools.call("read_file", {"path": "numbers.txt"}) == "1\n2\n3\n"
    assert tools.call("read_file", {"path": "sub/../numbers.txt"}) == "1\n2\n3\n"  # stays inside: allowed
    assert tools.call("write_file", {"path": "out/new.txt", "content": "hé"}) == "wrote 3 bytes to out/new.txt"
    assert (workdir / "out" / "new.txt").read_text() == "hé"
    assert tools.call("list_files", "") == "numbers.txt\nout/\nsub/"  # "" arguments mean {}


@pytest.mark.parametrize("path", ["/etc/passwd", "../secret.txt", "sub/../../secret.txt", "..", "\\etc\\x", "C:x"])
def test_paths_outside_the_workdir_are_refused(workdir: Path, path: str):
    tools = ToolSet(workdir)
    for name, args in (("read_file", {"path": path}), ("list_files", {"path": path}),
                       ("write_file", {"path": path, "content": "x"})):
        out = tools.call(name, args)
        assert out.startswith(f"error: {name}: path ") and ("absolute" in out or "outside" in out), out
    assert (workdir.parent / "secret.txt").read_text() == "top secret"


def test_a_symlink_leading_out_is_refused_one_inside_is_followed(workdir: Path):
    (workdir / "escape.txt").symlink_to(workdir.parent / "secret.txt")
    (workdir / "escape_dir").symlink_to(workdir.parent)
    (workdir / "alias.txt").symlink_to(workdir / "numbers.txt")
    tools = ToolSet(workdir)
    assert "outside the working directory" in tools.call("read_file", {"path": "escape.txt"})
    assert "outside the working directory" in tools.call("list_files", {"path": "escape_dir"})
    assert "outside the working directory" in tools.call("read_file", {"path": "escape_dir/secret.txt"})
    assert "outside the working directory" in tools.call("write_file", {"path": "escape.txt", "content": "pwned"})
    assert (workdir.parent / "secret.txt").read_text() == "top secret"
    assert tools.call("read_file", {"path": "alias.txt"}) == "1\n2\n3\n"


def test_a_workdir_reached_through_a_symlink_still_works(workdir: Path, tmp_path: Path):
    link = tmp_path / "link"
    link.symlink_to(workdir)
    assert ToolSet(link).call("read_file", {"path": "numbers.txt"}) == "1\n2\n3\n"


def test_read_file_is_capped_with_a_note(workdir: Path):
    (workdir / "big.txt").write_text("a" * (READ_LIMIT_BYTES + 10))
    out = ToolSet(workdir).call("read_file", {"path": "big.txt"})
    assert out.startswith("a" * READ_LIMIT_BYTES)
    assert out[READ_LIMIT_BYTES:] == (f"\n[truncated: big.txt is {READ_LIMIT_BYTES + 10} bytes; "
                                      f"only the first {READ_LIMIT_BYTES} are shown]")


def test_builtin_argument_errors_are_text(workdir: Path):
    tools = ToolSet(workdir)
    assert "is a directory" in tools.call("read_file", {"path": "sub"})
    assert tools.call("read_file", {"path": "missing.txt"}) == "error: read_file: 'missing.txt' does not exist"
    os.mkfifo(workdir / "pipe")
    assert tools.call("read_file", {"path": "pipe"}) == "error: read_file: 'pipe' is not a regular file"
    assert "not a directory" in tools.call("list_files", {"path": "numbers.txt"})
    assert "argument 'path' must be a string, got nothing" in tools.call("read_file", {})
    assert "argument 'content' must be a string, got 5" in tools.call("write_file", {"path": "a", "content": 5})


# -- calculator ---------------------------------------------------------------------------------

@pytest.mark.parametrize("expression, result", [
    ("1 + 2 * 3", "7"), ("(1 + 2) * 3", "9"), ("-2 ** 2", "-4"), ("7 // 2", "3"), ("7 % 3", "1"),
    ("1 / 4", "0.25"), ("2 ** 10", "1024"), ("2 ** -1", "0.5"), ("1.5 * 2", "3.0"), ("--3", "3"),
])
def test_calculator_arithmetic(workdir: Path, expression: str, result: str):
    assert ToolSet(workdir).call("calculator", {"expression": expression}) == result


@pytest.mark.parametrize("expression, why", [
    ("__import__('os').system('true')", "Call is not allowed"),
    ("x + 1", "Name is not allowed"),
    ("(1).__class__", "Attribute is not allowed"),
    ("[1, 2]", "List is not allowed"),
    ("1 << 2", "LShift is not allowed"),
    ("True + 1", "Constant is not allowed"),
    ("'a' * 3", "Constant is not allowed"),
    ("1j * 2", "Constant is not allowed"),
    ("lambda: 1", "Lambda is not allowed"),
    ("2 ** 100000", "exponent 100000 is out of range"),
    ("9 ** 999 ** 2", "out of range"),
    ("(10 ** 300) ** 5", "exceeds 4096 bits"),
    ("(2 ** 1000) * (2 ** 1000) * (2 ** 1000) * (2 ** 1000) * (2 ** 1000)", "exceeds 4096 bits"),
    ("(-8) ** 0.5", "not a real number"),
    ("1 / 0", "ZeroDivisionError"),
    ("10.0 ** 400", "OverflowError"),
    ("1 +", "cannot parse"),
    ("(" * 300 + "1" + ")" * 300, "cannot parse"),
])
def test_calculator_refuses_everything_but_bounded_arithmetic(workdir: Path, expression: str, why: str):
    out = ToolSet(workdir).call("calculator", {"expression": expression})
    assert out.startswith("error: calculator: ") and why in out, out


# -- task tools ---------------------------------------------------------------------------------

def test_task_tools_impl_and_static_output(workdir: Path, impl_module: str):
    import importlib
    module = importlib.import_module(impl_module)
    tools = ToolSet.for_task(FakeTask("t1", tools=(tool("lookup", impl=f"{impl_module}:lookup", strict=True),
                                                   tool("weather", output="sunny"))), workdir)
    assert tools.names == (*BUILTIN_NAMES, "lookup", "weather")
    assert tools.call("lookup", '{"key": "k"}') == "k=1"
    assert module.CALLS[-1] == ({"key": "k"}, workdir.resolve())
    assert tools.call("weather", {}) == "sunny"
    # The definitions never carry the implementation keys; extra keys (strict) pass through.
    lookup = tools.definitions()[-2]
    assert lookup == {"type": "function", "name": "lookup", "description": "the lookup tool", "strict": True,
                      "parameters": {"type": "object", "properties": {"key": {"type": "string"}}}}
    assert tools.chat_tools()[-2] == {"type": "function", "function": {
        "name": "lookup", "description": "the lookup tool", "parameters": lookup["parameters"], "strict": True}}
    assert tools.anthropic_tools()[-1] == {"name": "weather", "description": "the weather tool",
                                          "input_schema": lookup["parameters"]}
    assert all("impl" not in json.dumps(d) and "sunny" not in json.dumps(d) for d in tools.definitions())


def test_definitions_are_copies_and_builtins_can_be_left_out(workdir: Path):
    tools = ToolSet(workdir, [tool("only", output="x")], builtins=False)
    tools.definitions()[0]["parameters"]["properties"].clear()
    assert tools.definitions()[0]["parameters"]["properties"] == {"key": {"type": "string"}}
    assert tools.names == ("only",)
    assert tools.call("read_file", {"path": "numbers.txt"}) == "error: unknown tool 'read_file'; available: only"
    assert {d["name"] for d in ToolSet(workdir).definitions()} == set(BUILTIN_NAMES)


def test_a_failing_task_tool_is_text_not_an_exception(workdir: Path, impl_module: str):
    tools = ToolSet(workdir, [tool("boom", impl=f"{impl_module}:boom"), tool("exits", impl=f"{impl_module}:exits"),
                              tool("not_text", impl=f"{impl_module}:not_text")])
    assert tools.call("boom", {}) == "error: tool 'boom' raised ValueError: kaput"
    assert tools.call("exits", {}) == "error: tool 'exits' raised SystemExit: 3"
    assert tools.call("not_text", {}) == "error: tool 'not_text' returned int, not str (fix the tool's implementation)"


@pytest.mark.parametrize("spec, message", [
    (tool("t"), "tool 't' has neither impl nor output; give exactly one of"),
    (tool("t", impl="m:f", output="x"), "tool 't' has both impl and output"),
    (tool("read_file", output="x"), "tool 'read_file' shadows the built-in tool"),
    (tool("bad name", output="x"), "tools[0]: name 'bad name' must be 1-64 letters"),
    ({**tool("t", output="x"), "type": "custom"}, "tool 't': type 'custom' must be 'function'"),
    (tool("t", output=3), "tool 't': output must be a string"),
    (tool("t", impl="no_colon"), "tool 't': task tool 'no_colon' must be 'module:Class'"),
    (tool("t", impl="tt_no_such_module_xyz:f"), "tool 't': could not load task tool"),
    (tool("t", impl="os:no_such_function"), "module os has no attribute 'no_such_function'"),
    ({**tool("t", output="x"), "parameters": {"type": "string"}}, "tool 't': parameters"),
    ({**tool("t", output="x"), "description": 5}, "tool 't': description must be a string"),
    ("not an object", "tools[0] must be an object"),
])
def test_bad_task_tools_are_config_errors_naming_task_and_tool(workdir: Path, spec, message: str):
    with pytest.raises(ConfigError) as info:
        ToolSet.for_task(FakeTask("task-7", tools=(spec,)), workdir)
    assert str(info.value).startswith("task 'task-7': ") and message in str(info.value), str(info.value)
    with pytest.raises(ConfigError, match="^task 'task-7'"):
        check_task_tools([spec], "task 'task-7'")


def test_not_callable_duplicate_and_not_a_list(workdir: Path, impl_module: str):
    with pytest.raises(ConfigError, match="impl 'tt_test_task_tools:NOT_CALLABLE' is a int, not a function"):
        check_task_tools([tool("t", impl=f"{impl_module}:NOT_CALLABLE")], "task 'a'")
    with pytest.raises(ConfigError, match="task 'a': tool 't' is declared twice"):
        check_task_tools([tool("t", output="1"), tool("t", output="2")], "task 'a'")
    with pytest.raises(ConfigError, match="task 'a': tools must be a list"):
        check_task_tools({"name": "t"}, "task 'a'")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="is not a directory"):
        ToolSet(workdir / "missing")
    assert issubclass(ConfigError, TokentrailError)


# -- never raises -------------------------------------------------------------------------------

def test_unknown_tools_and_bad_arguments_are_text(workdir: Path):
    tools = ToolSet(workdir)
    assert tools.call("nope", {}) == f"error: unknown tool 'nope'; available: {', '.join(BUILTIN_NAMES)}"
    assert tools.call("read_file", "{bad").startswith("error: arguments for 'read_file' are not valid JSON")
    assert tools.call("read_file", "[1]") == "error: arguments for 'read_file' must be a JSON object, got list"
    assert tools.call(None, {}).startswith("error: unknown tool None")  # type: ignore[arg-type]


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                       max_size=3), max_leaves=8)


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from([*BUILTIN_NAMES, "nope", ""]),
       arguments=st.text(max_size=40) | st.dictionaries(st.sampled_from(["path", "content", "expression", "x"]),
                                                       json_values, max_size=3))
def test_call_never_raises(tmp_path_factory: pytest.TempPathFactory, name: str, arguments):
    root = tmp_path_factory.getbasetemp() / "never_raises"
    root.mkdir(exist_ok=True)
    out = ToolSet(root).call(name, arguments)
    assert isinstance(out, str)
    for child in root.iterdir():  # whatever write_file made stays inside
        assert child.resolve().is_relative_to(root.resolve())
    assert not os.path.exists(root.parent / "x")
