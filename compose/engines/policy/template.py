"""The reference policy's chat template (ChatML-like), designed to be prefix-extendable.

A message renders as ``<|im_start|>{role}\\n{content}<|im_end|>``; messages are joined
with ``"\\n"``; the generation prompt is ``"\\n<|im_start|>assistant\\n"``. The separator
comes *before* each following message, so when a harness echoes the assistant turn
faithfully::

    prompt(call N+1) == prompt(call N) + generated(call N) + tokens(new messages)

both as text and as token ids (the tokenizer never merges across special tokens, and the
generated text starts with a special token or a word right after the role line's
``"\\n"``).

Guarantees:

* Rendering is a pure function of (messages, tools, drop_reasoning).
* Tools render into the system message (one is created when absent) as one
  ``json.dumps(function, sort_keys=True, ensure_ascii=False)`` line per tool.
* An assistant tool call renders as ``<tool_call>{"name": NAME, "arguments": ARGS}</tool_call>``
  with ``ARGS`` = ``function.arguments`` inserted verbatim: the exact text the model
  generated (``tool_call_body`` is the single place that builds this text, for the
  template and for the model).
* Assistant ``reasoning`` (or ``reasoning_content``) renders as ``<think>...</think>``
  before the content unless ``drop_reasoning`` (a realistic re-rendering drift).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from schemas.errors import TokentrailError

GENERATION_PROMPT = "\n<|im_start|>assistant\n"
IMAGE_PLACEHOLDER = "[image]"
_TOOLS_HEADER = (
    "# Tools\n"
    "You may call the functions below. Each line describes one function as JSON. "
    "Wrap a call in tool_call tags as a JSON object with name and arguments."
)
_ROLE_ALIASES = {"developer": "system", "function": "tool"}


class TemplateError(TokentrailError, ValueError):
    """The messages cannot be rendered (the server answers 400 with this text)."""


def content_text(content: Any) -> str:
    """Text of an OpenAI ``content`` value: a string, None, or a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out: list[str] = []
        for part in content:
            if isinstance(part, str):
                out.append(part)
            elif not isinstance(part, dict):
                raise TemplateError("content parts must be objects")
            elif part.get("type") in ("text", "input_text", "output_text"):
                text = part.get("text")
                if not isinstance(text, str):
                    raise TemplateError("a text content part needs a string 'text'")
                out.append(text)
            elif part.get("type") in ("image_url", "input_image", "image"):
                out.append(IMAGE_PLACEHOLDER)
            else:
                out.append(f"[{part.get('type', 'part')}]")
        return "".join(out)
    raise TemplateError("message content must be a string, null or a list of parts")


def tool_call_body(name: str, arguments: str) -> str:
    """The JSON text between ``<tool_call>`` and ``</tool_call>``."""
    return '{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": ' + arguments + "}"


def render_tool_call(name: str, arguments: str) -> str:
    return "<tool_call>" + tool_call_body(name, arguments) + "</tool_call>"


def tools_block(tools: Sequence[Any] | None) -> str:
    """The deterministic listing of offered tools (empty when there are none)."""
    if not tools:
        return ""
    lines = [_TOOLS_HEADER]
    for tool in tools:
        if not isinstance(tool, dict):
            raise TemplateError("each tool must be an object")
        function = tool.get("function", tool)
        lines.append(json.dumps(function, sort_keys=True, ensure_ascii=False))
    return "\n".join(lines)


def _arguments_text(arguments: Any) -> str:
    if isinstance(arguments, str):
        return arguments  # verbatim: the exact text the model generated
    if arguments is None:
        return "{}"
    return json.dumps(arguments, ensure_ascii=False)


def render_message(message: Any, *, drop_reasoning: bool = False) -> str:
    """One message, ``<|im_start|>{role}\\n{content}<|im_end|>``."""
    if not isinstance(message, dict):
        raise TemplateError("each message must be an object")
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise TemplateError("each message needs a string 'role'")
    role = _ROLE_ALIASES.get(role, role)
    body = content_text(message.get("content"))
    if role == "assistant":
        parts: list[str] = []
        reasoning = message.get("reasoning")
        if reasoning is None:
            reasoning = message.get("reasoning_content")
        if reasoning and not drop_reasoning:
            parts.append("<think>" + content_text(reasoning) + "</think>")
        parts.append(body)
        for call in message.get("tool_calls") or ():
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise TemplateError("each tool call needs function.name")
            parts.append(render_tool_call(function["name"], _arguments_text(function.get("arguments"))))
        body = "".join(parts)
    return f"<|im_start|>{role}\n{body}<|im_end|>"


def with_tools(messages: Sequence[Any], tools: Sequence[Any] | None) -> list[Any]:
    """Messages with the tool listing folded into the (possibly new) system message."""
    block = tools_block(tools)
    messages = list(messages)
    if not block:
        return messages
    first = messages[0] if messages else None
    if isinstance(first, dict) and first.get("role") in ("system", "developer"):
        text = content_text(first.get("content"))
        merged = dict(first, role="system", content=(text + "\n\n" + block) if text else block)
        return [merged] + messages[1:]
    return [{"role": "system", "content": block}] + messages


def render_messages(
    messages: Sequence[Any], tools: Sequence[Any] | None = None, *, drop_reasoning: bool = False
) -> str:
    """All messages joined with ``"\\n"``, without the generation prompt."""
    if not isinstance(messages, (list, tuple)):
        raise TemplateError("'messages' must be a list")
    return "\n".join(
        render_message(m, drop_reasoning=drop_reasoning) for m in with_tools(messages, tools)
    )


def render_prompt(
    messages: Sequence[Any],
    tools: Sequence[Any] | None = None,
    *,
    add_generation_prompt: bool = True,
    drop_reasoning: bool = False,
) -> str:
    """The full prompt text the model generates from."""
    text = render_messages(messages, tools, drop_reasoning=drop_reasoning)
    return text + GENERATION_PROMPT if add_generation_prompt else text


def render_continuation(
    messages: Sequence[Any], *, add_generation_prompt: bool = True, drop_reasoning: bool = False
) -> str:
    """Text that follows an earlier turn: ``"\\n" + message`` each, then the generation
    prompt. Used with a supplied prefix that already ends with the parent's ``<|im_end|>``."""
    text = "".join("\n" + render_message(m, drop_reasoning=drop_reasoning) for m in messages)
    return text + GENERATION_PROMPT if add_generation_prompt else text


def last_assistant_index(messages: Sequence[Any]) -> int | None:
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if isinstance(m, dict) and m.get("role") == "assistant":
            return i
    return None
