"""Parsing a forced tool choice's JSON output the way vLLM does (``vllm/parser/abstract_parser.py``,
``vllm/tool_parsers/streaming.py``).

With ``tool_choice`` ``"required"`` the model writes ``[{"name": ..., "parameters": {...}}, ...]``;
with a named tool it writes that tool's arguments object alone.

Non-streaming (``result``): a named tool's call takes the content text verbatim as its
arguments (none when the text is blank); ``"required"`` validates the array and rebuilds
each call's arguments with ``json.dumps(parameters, ensure_ascii=False)``; an array that
does not validate (e.g. cut by ``max_tokens``) yields no calls.

Streaming (``ForcedStream.feed``): a named tool sends every text delta as arguments (the
first delta with ``id``, ``type`` and ``function.name``); ``"required"`` scans the text so
far (``scan_required``, a port of vLLM's ``_scan_required_tool_calls``) and sends, per
array element, its id and name once the name is complete and its parameters value has
started, then only new parameter text (``function.name`` explicitly ``null``).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any


def make_tool_call_id() -> str:
    """vLLM's random tool call id (``vllm/renderers/chat_utils.py``)."""
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


def forced_name(tool_choice: Any) -> str | None:
    return (tool_choice.get("function") or {}).get("name") if isinstance(tool_choice, dict) else None


def result(tool_choice: Any, content: str | None) -> list[tuple[str, str, str]]:
    """(id, name, arguments) of the forced calls in ``content``."""
    name = forced_name(tool_choice)
    if name is not None:
        if content is None or not content.strip():
            return []
        return [(make_tool_call_id(), name, content)]
    try:
        calls = json.loads(content or "")
    except ValueError:
        return []
    if not isinstance(calls, list) or not all(isinstance(c, dict) and isinstance(c.get("name"), str)
                                              and isinstance(c.get("parameters", {}), (dict, type(None)))
                                              for c in calls):
        return []
    return [(make_tool_call_id(), c["name"], json.dumps(c.get("parameters"), ensure_ascii=False)) for c in calls]


@dataclass
class Span:
    name: str | None = None
    name_end: int | None = None
    args_start: int | None = None
    args_end: int | None = None

    def ready_at(self, length: int) -> bool:
        return (self.name is not None and self.name_end is not None and self.name_end <= length
                and self.args_start is not None and self.args_start < length)


def scan_required(text: str) -> list[Span]:
    """Each top-level element of a (partial) required-tool-call array: its name and parameters span."""
    spans: list[Span] = []
    depth, in_string, escaped, string_start, value_start = 0, False, False, 0, 0
    cur: Span | None = None
    expect, key = "key", None

    def end_value(pos: int) -> None:
        nonlocal expect
        assert cur is not None  # called inside an element only
        if key == "parameters":
            cur.args_end = pos
        elif key == "name" and expect == "string":
            try:
                cur.name, cur.name_end = json.loads(text[value_start:pos]), pos
            except ValueError:
                cur.name = None
        expect = "after"

    def start_value(pos: int, state: str) -> None:
        nonlocal expect, value_start
        assert cur is not None  # called inside an element only
        value_start = pos
        if key == "parameters":
            cur.args_start = pos
        expect = state

    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
                if depth == 2 and cur is not None:
                    if expect == "key":
                        key, expect = text[string_start + 1:i], "colon"
                    elif expect == "string":
                        end_value(i + 1)
            continue
        if ch == '"':
            in_string, string_start = True, i
            if depth == 2 and cur is not None and expect == "value":
                start_value(i, "string")
            continue
        if ch in "{[":
            if depth == 0 and ch != "[" or depth == 1 and ch != "{":
                return spans
            if depth == 1:
                cur = Span()
                spans.append(cur)
                expect, key = "key", None
            elif depth == 2 and cur is not None and expect == "value":
                start_value(i, "container")
            depth += 1
            continue
        if ch in "}]":
            if depth == 2 and cur is not None and expect == "scalar":
                end_value(i)
            depth -= 1
            if depth == 2 and cur is not None and expect == "container":
                end_value(i + 1)
            elif depth == 1:
                cur = None
            elif depth <= 0:
                return spans
            continue
        if depth != 2 or cur is None:
            continue
        if ch == ":" and expect == "colon":
            expect = "value"
        elif ch == ",":
            if expect == "scalar":
                end_value(i)
            expect, key = "key", None
        elif ch.isspace():
            if expect == "scalar":
                end_value(i)
        elif expect == "value":
            start_value(i, "scalar")
    return spans


class ForcedStream:
    """Streaming tool-call deltas of a forced tool choice; ``feed`` takes each content text delta."""

    def __init__(self, tool_choice: Any) -> None:
        self.name = forced_name(tool_choice)
        self.text = ""
        self.name_sent = False

    def feed(self, delta: str) -> list[dict] | None:
        previous, self.text = self.text, self.text + delta
        if self.name is not None:
            if self.name_sent:
                return [{"index": 0, "function": {"arguments": delta}}]
            self.name_sent = True
            return [{"id": make_tool_call_id(), "type": "function", "index": 0,
                     "function": {"name": self.name, "arguments": delta}}]
        calls: list[dict] = []
        for index, span in enumerate(scan_required(self.text)):
            if span.name is None or span.args_start is None:
                break  # elements come in order: nothing later is ready
            end = span.args_end if span.args_end is not None else len(self.text)
            if span.ready_at(len(previous)):
                new = self.text[min(end, len(previous)):end]
                if new:
                    calls.append({"index": index, "function": {"name": None, "arguments": new}})
                continue
            calls.append({"id": make_tool_call_id(), "type": "function", "index": index,
                          "function": {"name": span.name, "arguments": self.text[span.args_start:end]}})
        return calls or None
