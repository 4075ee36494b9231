"""The scripted agent policy: which tokens the reference policy generates.

The *decision* (tool call or final answer, which tool, which arguments) is scripted so
tests can drive multi-turn tool use; every emitted token's log-prob is nevertheless the
model table's log-prob of that token in its actual context (``model.py``).

Decision rule:

* Tools offered, ``tool_choice`` not ``"none"``, and fewer than K tool results since
  the last user message (K from a ``#tool-calls=K`` directive in a system or user
  message, else the server default, 2) -> one tool call::

      <tool_call> + encode('{"name": "<tool>", "arguments": <args>}') + </tool_call> + <|im_end|>

  ``tool_choice: "required"`` or a named tool always calls. The tool is the named one,
  else a ``#tool=NAME`` directive, else ``Bash``/``bash`` if offered, else the first.
  Arguments are built from the schema's required properties and serialised with
  ``json.dumps(args, ensure_ascii=False)``.
* Otherwise a final answer: a sampled sentence of 8-40 tokens, then ``<|im_end|>``.
* With reasoning on, ``<think>`` + sampled words + ``</think>`` come first.

Guarantees: free text is drawn only from whole pre-token pieces (a capitalised word,
then space-prefixed words, then one ``.``), so ``encode(decode(ids)) == ids`` for the
generated ids, unless the ``drift`` fault asks for one non-canonical (byte-split) word.
Generation stops at ``<|im_end|>`` (unless ``ignore_eos``), at a stop token id or stop
string, or at ``max_tokens`` (finish reason ``length``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compose.policy import template, tokenizer as tk
from compose.policy.model import PolicyModel
from compose.policy.words import WORDS

_K_DIRECTIVE = re.compile(r"#tool-calls=(\d+)")
_TOOL_DIRECTIVE = re.compile(r"#tool=([A-Za-z0-9_.:\-]+)")


@dataclass
class GenerationParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    reasoning: bool = False
    drift: bool = False
    weight_version: int = 0


@dataclass
class Generation:
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)  # table row of each position (top_logprobs)
    finish_reason: str | None = None  # "stop" | "length"
    stop_reason: str | int | None = None
    weight_version: int = 0


@dataclass
class ToolDecision:
    name: str
    arguments: str  # the exact JSON text the model generates


def directive_values(messages: list[Any]) -> tuple[int | None, str | None]:
    """(K, tool name) from ``#tool-calls=K`` / ``#tool=NAME`` in system and user messages."""
    k = name = None
    for m in messages:
        if isinstance(m, dict) and m.get("role") in ("system", "developer", "user"):
            text = template.content_text(m.get("content"))
            for match in _K_DIRECTIVE.finditer(text):
                k = int(match.group(1))
            for match in _TOOL_DIRECTIVE.finditer(text):
                name = match.group(1)
    return k, name


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


def decide_tool_call(
    messages: list[Any], tools: list[Any] | None, tool_choice: Any, default_k: int,
    rng: np.random.Generator,
) -> ToolDecision | None:
    """The scripted decision; None means a final answer."""
    if not tools or tool_choice == "none":
        return None
    offered = {_tool_function(t).get("name"): _tool_function(t) for t in tools}
    k, wanted = directive_values(messages)
    done = tool_results_since_last_user(messages)
    named = None
    if isinstance(tool_choice, dict):
        named = (tool_choice.get("function") or {}).get("name")
    if named is None and tool_choice != "required" and done >= (default_k if k is None else k):
        return None
    for candidate in (named, wanted, "Bash", "bash"):
        if candidate in offered:
            function = offered[candidate]
            break
    else:
        function = _tool_function(tools[0])
    args = build_arguments(function.get("parameters") or {}, done + 1, rng)
    return ToolDecision(str(function.get("name", "")), json.dumps(args, ensure_ascii=False))


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
        elif name == "command":
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


class _Writer:
    """Appends tokens with their table log-probs and enforces the stopping rules."""

    def __init__(self, model: PolicyModel, tok: tk.Tokenizer, prompt_ids: list[int],
                 params: GenerationParams, rng: np.random.Generator) -> None:
        self.model, self.tok, self.params, self.rng = model, tok, params, rng
        self.version = params.weight_version
        self.table = model.table(self.version)
        self.ctx = model.context(prompt_ids)
        self.out = Generation(weight_version=self.version)
        self.drift_pending = params.drift
        self.text = ""
        self.done = params.max_tokens <= 0
        if self.done:
            self.out.finish_reason = "length"

    def _row(self) -> int:
        a, b, c = self.ctx
        return self.model.row(a, b, c, self.version)

    def emit(self, token: int, row: int | None = None) -> bool:
        if self.done:
            return False
        row = self._row() if row is None else row
        out = self.out
        out.token_ids.append(token)
        out.logprobs.append(float(self.table[row, token]))
        out.rows.append(row)
        self.ctx = (self.ctx[1], self.ctx[2], token)
        if token == tk.IM_END and not self.params.ignore_eos:
            self._finish("stop", None)
        elif token in self.params.stop_token_ids:
            self._finish("stop", token)
        elif len(out.token_ids) >= self.params.max_tokens:
            self._finish("length", None)
        return not self.done

    def emit_piece(self, token: int, row: int | None = None, check_stop: bool = False) -> bool:
        """Emit a text token; the drift fault splits the first multi-byte piece into bytes."""
        data = self.tok.token_bytes(token)
        if self.drift_pending and token >= tk.PIECE_OFFSET and len(data) > 1:
            self.drift_pending = False
            alive = all(self.emit(tk.BYTE_OFFSET + b) for b in data)
        else:
            alive = self.emit(token, row)
        if alive and check_stop and self.params.stop:
            # vLLM checks stop strings against the decoded output text
            self.text += self.tok.token_str(token)
            hit = next((s for s in self.params.stop if s in self.text), None)
            if hit is not None:
                self._finish("stop", hit)
                return False
        return alive

    def sample(self, allowed: np.ndarray, key: str, check_stop: bool = False) -> bool:
        if self.done:
            return False
        row = self._row()
        p = self.params
        token = self.model.draw(self.rng, row, self.version, allowed, key,
                                p.temperature, p.top_p, p.top_k)
        return self.emit_piece(token, row, check_stop)

    def _finish(self, reason: str, stop_reason: str | int | None) -> None:
        self.done = True
        self.out.finish_reason = reason
        self.out.stop_reason = stop_reason


class AgentPolicy:
    """Turns a rendered prompt plus the request's conversation into a Generation."""

    def __init__(self, model: PolicyModel, tok: tk.Tokenizer, default_tool_calls: int = 2):
        self.model, self.tok, self.default_tool_calls = model, tok, default_tool_calls
        self.words = np.asarray(tok.spaced_word_ids, dtype=np.int64)
        self.starts = np.asarray(tok.sentence_start_ids, dtype=np.int64)
        self.period = tok.piece_id(".")

    def generate(self, prompt_ids: list[int], messages: list[Any], tools: list[Any] | None,
                 tool_choice: Any, params: GenerationParams, rng: np.random.Generator) -> Generation:
        w = _Writer(self.model, self.tok, prompt_ids, params, rng)
        decision = decide_tool_call(messages, tools, tool_choice, self.default_tool_calls, rng)
        if params.reasoning and w.emit(tk.THINK):
            for _ in range(int(rng.integers(4, 17))):
                if not w.sample(self.words, "words"):
                    break
            w.emit(tk.THINK_END)
        if decision is not None:
            if w.emit(tk.TOOL_CALL):
                body = template.tool_call_body(decision.name, decision.arguments)
                for token in self.tok.encode(body):
                    if not w.emit_piece(token):
                        break
                w.emit(tk.TOOL_CALL_END)
        elif w.sample(self.starts, "starts", check_stop=True):
            for _ in range(int(rng.integers(6, 38))):
                if not w.sample(self.words, "words", check_stop=True):
                    break
            if self.period is not None:
                w.emit_piece(self.period, check_stop=True)
        if params.ignore_eos:
            while w.sample(self.words, "words", check_stop=decision is None):
                pass
        else:
            w.emit(tk.IM_END)
        if w.out.finish_reason is None:  # cannot happen: every path ends at a stop rule
            w.out.finish_reason = "stop"
        return w.out
