"""The scripted decisions of the reference policy: tool call or final answer, which tool, which arguments.

Decision rule:

* Tools offered, ``tool_choice`` not ``"none"``, and fewer than K tool results since
  the last user message (K from a ``#tool-calls=K`` directive in a system or user
  message, else the server default, 2) -> a tool call; ``tool_choice: "required"`` or a
  named tool always calls.
* The tool is the named one, else a ``#tool=NAME`` directive, else a harness's shell tool if
  offered (``SHELL_TOOLS``: Claude Code's ``Bash``, ``bash``, the Gemini CLI's
  ``run_shell_command``), else the first.
* ``#parallel-calls=N`` makes one turn call the tool N times (arguments numbered on),
  which is what ``parallel_tool_calls=false`` is there to cut.
* Codex's sub-agent tools (``spawn_agent``, ``wait_agent``) follow ``multi_agent``'s three rules.
* ``#answer-words=N`` makes a final answer N words after its first (else 6-37): a test that
  needs a long answer (a compaction summary) asks for one.
* Arguments are built from the schema's required properties and serialised with
  ``json.dumps(args, ensure_ascii=False)``.

Guarantees: a pure function of the messages, tools, tool choice and the generator passed
in (which only picks words for free-text string arguments).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from compose.engines.policy import multi_agent, template
from compose.engines.policy.words import WORDS

_K_DIRECTIVE = re.compile(r"#tool-calls=(\d+)")
_TOOL_DIRECTIVE = re.compile(r"#tool=([A-Za-z0-9_.:\-]+)")
_PARALLEL_DIRECTIVE = re.compile(r"#parallel-calls=(\d+)")
_ANSWER_DIRECTIVE = re.compile(r"#answer-words=(\d+)")

#: Shell tools picked, in this order, when offered and nothing names a tool.
SHELL_TOOLS = ("Bash", "bash", "run_shell_command")


@dataclass
class ToolDecision:
    name: str
    arguments: str  # the exact JSON text the model generates


def _directive_texts(messages: list[Any]) -> list[str]:
    return [template.content_text(m.get("content")) for m in messages
            if isinstance(m, dict) and m.get("role") in ("system", "developer", "user")]


def directive_values(messages: list[Any]) -> tuple[int | None, str | None]:
    """(K, tool name) from ``#tool-calls=K`` / ``#tool=NAME`` in system and user messages."""
    k = name = None
    for text in _directive_texts(messages):
        for match in _K_DIRECTIVE.finditer(text):
            k = int(match.group(1))
        for match in _TOOL_DIRECTIVE.finditer(text):
            name = match.group(1)
    return k, name


def parallel_calls(messages: list[Any]) -> int:
    """N from the last ``#parallel-calls=N`` directive (1 without one)."""
    n = 1
    for text in _directive_texts(messages):
        for match in _PARALLEL_DIRECTIVE.finditer(text):
            n = max(1, int(match.group(1)))
    return n


def answer_words(messages: list[Any]) -> int | None:
    """N from the last ``#answer-words=N`` directive (a final answer of N sampled words after its first;
    None without one: a random length)."""
    n = None
    for text in _directive_texts(messages):
        for match in _ANSWER_DIRECTIVE.finditer(text):
            n = max(1, min(int(match.group(1)), 4096))
    return n


def tool_results_since_last_user(messages: list[Any]) -> int:
    count = 0
    for m in reversed(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if role == "user":
            break
        if role in ("tool", "function"):
            count += 1
    return count


def _tool_function(tool: Any) -> dict:
    function = tool.get("function", tool) if isinstance(tool, dict) else {}
    return function if isinstance(function, dict) else {}


def decide_tool_calls(
    messages: list[Any], tools: list[Any] | None, tool_choice: Any, default_k: int,
    rng: np.random.Generator,
) -> list[ToolDecision]:
    """The scripted decision; an empty list means a final answer."""
    if not tools or tool_choice == "none":
        return []
    offered = {_tool_function(t).get("name"): _tool_function(t) for t in tools}
    agent_turn = multi_agent.decide(messages, set(offered))
    if agent_turn is not None:
        return [ToolDecision(name, arguments) for name, arguments in agent_turn]
    k, wanted = directive_values(messages)
    done = tool_results_since_last_user(messages)
    named = None
    if isinstance(tool_choice, dict):
        named = (tool_choice.get("function") or {}).get("name")
    if named is None and tool_choice != "required" and done >= (default_k if k is None else k):
        return []
    for candidate in (named, wanted, *SHELL_TOOLS):
        if candidate in offered:
            function = offered[candidate]
            break
    else:
        function = _tool_function(tools[0])
    schema = function.get("parameters") or {}
    name = str(function.get("name", ""))
    calls = [multi_agent.with_child_task(name, build_arguments(schema, done + 1 + i, rng))
             for i in range(parallel_calls(messages))]
    return [ToolDecision(name, json.dumps(args, ensure_ascii=False)) for args in calls]


def decide_tool_call(
    messages: list[Any], tools: list[Any] | None, tool_choice: Any, default_k: int,
    rng: np.random.Generator,
) -> ToolDecision | None:
    """The first call of ``decide_tool_calls`` (None: a final answer)."""
    calls = decide_tool_calls(messages, tools, tool_choice, default_k, rng)
    return calls[0] if calls else None


def build_arguments(schema: dict, n: int, rng: np.random.Generator) -> dict[str, Any]:
    """Arguments for the schema's required properties (see the module docstring)."""
    properties = schema.get("properties") or {}
    args: dict[str, Any] = {}
    for name in schema.get("required") or ():
        prop = properties.get(name) or {}
        kind = prop.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "string")
        if isinstance(prop.get("enum"), list) and prop["enum"]:
            args[name] = prop["enum"][0]
        elif name in ("command", "cmd"):  # Claude Code's Bash, the Gemini CLI's run_shell_command, Codex's exec_command
            args[name] = f"echo tokentrail-{n}"
        elif name in ("file_path", "path"):
            args[name] = f"/tmp/tokentrail-{n}.txt"
        elif kind in ("integer", "number"):
            args[name] = 1
        elif kind == "boolean":
            args[name] = False
        elif kind == "array":
            args[name] = []
        elif kind == "object":
            args[name] = {}
        else:
            args[name] = WORDS[int(rng.integers(len(WORDS)))]
    return args


def forced_json_text(calls: list[ToolDecision], tool_choice: Any) -> str:
    """What vLLM's grammar makes the model write for a forced tool choice (``vllm/parser/abstract_parser.py``).

    A named tool: its arguments object alone; ``"required"``: the array
    ``[{"name": ..., "parameters": {...}}, ...]``."""
    if isinstance(tool_choice, dict):
        return calls[0].arguments
    return "[" + ", ".join('{"name": ' + json.dumps(c.name, ensure_ascii=False) + ', "parameters": '
                           + c.arguments + "}" for c in calls) + "]"
