"""Turning generated ids into vLLM's parsed output: reasoning, content and tool calls.

This plays the part of vLLM's reasoning parser (``<think>...</think>``) plus the Hermes
tool parser (``<tool_call>{"name": ..., "arguments": ...}</tool_call>``), for the
non-streaming message and for streaming deltas.

Guarantees:

* Both paths share one token-level state machine, so for a completed generation the
  concatenated streaming deltas equal the non-streaming message (reasoning, content,
  each tool call's name and arguments).
* Non-streaming, a tool call's ``arguments`` is re-serialised from the parsed body with
  ``json.dumps(arguments, ensure_ascii=False)`` (vLLM's Hermes ``extract_tool_calls``);
  streaming sends the raw text the model generated (brace-matched out of the call body,
  as the Hermes streaming parser does). The two agree for canonical JSON, which is what
  the scripted agent writes.
* A tool-call body that is not valid JSON (e.g. cut by ``max_tokens``) makes the whole
  output plain content including the markup text, as Hermes does when parsing fails.
* A forced tool choice in JSON form (``forced=True``) is parsed by ``forced.py`` instead
  of Hermes: markup tokens are then ordinary skipped special tokens.
* Streaming tool deltas follow vLLM's Hermes parser: the first delta of a call carries
  ``index``, ``id``, ``type`` and ``function.name``; later ones carry
  ``function.arguments`` fragments; deltas with tool calls carry ``content: null``.
"""

from __future__ import annotations

import codecs
import json
import re
from dataclasses import dataclass, field
from typing import Any

from compose.engines.policy import forced as forced_json
from compose.engines.policy import tokenizer as tk
from compose.engines.policy.forced import make_tool_call_id

_NAME = re.compile(r'"name"\s*:\s*"([^"]+)"')
_ARGS = re.compile(r'"arguments"\s*:\s*')


def extract_arguments(body: str) -> str | None:
    """The text of the ``arguments`` value in a (possibly partial) call body."""
    match = _ARGS.search(body)
    if not match:
        return None
    raw = body[match.end():]
    if not raw or raw[0] not in "{[":
        return raw.rstrip().removesuffix("}").rstrip() if raw else None
    close = "}" if raw[0] == "{" else "]"
    depth, in_str, esc = 0, False, False
    for i, ch in enumerate(raw):
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch == raw[0]:
            depth += 1
        elif ch == close:
            depth -= 1
            if depth == 0:
                return raw[: i + 1]
    return raw


@dataclass
class _Call:
    body: str = ""
    closed: bool = False
    name_sent: bool = False
    args_sent: str = ""
    id: str = field(default_factory=make_tool_call_id)


@dataclass
class ParsedOutput:
    reasoning: str | None
    content: str | None
    tool_calls: list[tuple[str, str, str]]  # (id, name, arguments)


class OutputParser:
    """Feed generated ids one at a time; ``feed`` returns the streaming delta (or None)."""

    def __init__(self, tok: tk.Tokenizer, *, tools_enabled: bool, tool_choice: Any = None,
                 forced: bool = False) -> None:
        self.tok = tok
        self.tool_choice = tool_choice
        self.forced = forced_json.ForcedStream(tool_choice) if forced and tools_enabled else None
        self.tools_enabled = tools_enabled and self.forced is None
        self.state = "content"
        self.reasoning: list[str] = []
        self.reasoning_seen = False
        self.reasoning_open = False
        self.content_before: list[str] = []  # content before the first tool call
        self.content_after: list[str] = []
        self.raw: list[str] = []  # everything after reasoning, markup included
        self.calls: list[_Call] = []
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token: int) -> dict | None:
        if token == tk.THINK and self.state == "content" and not self.calls:
            self.state, self.reasoning_seen, self.reasoning_open = "reasoning", True, True
            return None
        if token == tk.THINK_END and self.state == "reasoning":
            self.state, self.reasoning_open = "content", False
            return None
        if self.tools_enabled and token == tk.TOOL_CALL and self.state == "content":
            self.state = "tool"
            self.calls.append(_Call())
            self.raw.append("<tool_call>")
            return None
        if self.tools_enabled and token == tk.TOOL_CALL_END and self.state == "tool":
            self.state = "content"
            self.calls[-1].closed = True
            self.raw.append("</tool_call>")
            return None
        if self.tok.is_special(token):  # skipped like vLLM's skip_special_tokens
            return None
        text = self._decoder.decode(self.tok.token_bytes(token))
        if not text:
            return None
        if self.state == "reasoning":
            self.reasoning.append(text)
            return {"reasoning": text}
        self.raw.append(text)
        if self.forced is not None:
            self.content_before.append(text)
            calls = self.forced.feed(text)
            return {"tool_calls": calls} if calls else None
        if self.state == "content":
            (self.content_after if self.calls else self.content_before).append(text)
            return None if self.calls else {"content": text}
        call = self.calls[-1]
        call.body += text
        return self._tool_delta(len(self.calls) - 1, call)

    def _tool_delta(self, index: int, call: _Call) -> dict | None:
        deltas: list[dict] = []
        if not call.name_sent:
            match = _NAME.search(call.body)
            if not match:
                return None
            call.name_sent = True
            deltas.append({"id": call.id, "type": "function", "index": index,
                           "function": {"name": match.group(1)}})
        args = extract_arguments(call.body)
        if args is not None and len(args) > len(call.args_sent):
            diff = args[len(call.args_sent):]
            call.args_sent = args
            deltas.append({"index": index, "function": {"arguments": diff}})
        return {"content": None, "tool_calls": deltas} if deltas else None

    def result(self) -> ParsedOutput:
        """The non-streaming message for everything fed so far."""
        reasoning = "".join(self.reasoning) if self.reasoning_seen else None
        if self.forced is not None:
            content = "".join(self.content_before) if self.content_before or not self.reasoning_open else None
            return ParsedOutput(reasoning, None, forced_json.result(self.tool_choice, content))
        calls: list[tuple[str, str, str]] = []
        for call in self.calls:
            parsed = _parse_call(call)
            if parsed is None:  # Hermes: any broken call -> no tool calls, raw content
                return ParsedOutput(reasoning, "".join(self.raw), [])
            calls.append((call.id, *parsed))
        before = "".join(self.content_before)
        if calls:
            return ParsedOutput(reasoning, before or None, calls)
        if self.reasoning_open and not before:
            return ParsedOutput(reasoning, None, [])
        return ParsedOutput(reasoning, before, [])


def _parse_call(call: _Call) -> tuple[str, str] | None:
    try:
        obj = json.loads(call.body.strip())
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or "arguments" not in obj:
        return None
    return obj["name"], json.dumps(obj["arguments"], ensure_ascii=False)


def parse_output(tok: tk.Tokenizer, ids: list[int], *, tools_enabled: bool, tool_choice: Any = None,
                 forced: bool = False) -> ParsedOutput:
    parser = OutputParser(tok, tools_enabled=tools_enabled, tool_choice=tool_choice, forced=forced)
    for token in ids:
        parser.feed(token)
    return parser.result()
