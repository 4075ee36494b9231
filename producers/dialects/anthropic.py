"""Anthropic Messages API <-> OpenAI chat completions (pure; the request side lives here).

vLLM's own ``/v1/messages`` returns no token ids, so the interceptor sends an Anthropic
request upstream as a chat completion and translates the answer back
(``anthropic_output``, ``anthropic_stream``; re-exported here).

Guarantees of ``to_chat_request``:

* The chat messages say what the Anthropic messages say, in order: ``system`` becomes a
  leading system message; ``tool_result`` blocks become ``role: "tool"`` messages placed
  before the rest of their user message (the Anthropic API itself refuses tool results
  after other blocks, and so do we); ``thinking`` becomes the assistant's ``reasoning``;
  ``tool_use`` becomes a tool call whose ``arguments`` is
  ``json.dumps(input, ensure_ascii=False)`` (default separators: how vLLM's parsers
  serialise parsed arguments and what the model generated, so the echo re-renders
  token-identically).
* Text-only content of a non-assistant message becomes one string joined with ``"\\n"``
  (vLLM's own join of text parts); assistant text blocks are concatenated (the model
  generated one text). ``cache_control``, ``signature``, ``citations`` and
  ``redacted_thinking`` never reach the upstream.
* ``is_error`` on a tool result changes nothing: the result text goes upstream unchanged
  (Claude Code already writes the error into the text; an invented prefix would be text
  the harness never sent).
* Custom tools become chat function tools; server tools (``web_search_20250305``, ...) run
  at Anthropic and are skipped; ``tool_choice`` is sent only when a custom tool is. A
  trailing assistant message is Anthropic prefill (``continue_final_message``). Streaming
  asks for ``stream_options.include_usage`` (``message_delta`` reports output tokens).
* Anything that cannot be expressed faithfully raises ``DialectError`` naming it.
* Top-level keys other than the translated ones are dropped; ``dropped_keys`` lists them.
"""

from __future__ import annotations

import json
from typing import Any

from producers.dialects.anthropic_output import from_chat_response
from producers.dialects.anthropic_stream import StreamTranslator
from producers.dialects.common import (
    IMAGE_PLACEHOLDER,
    DialectError,
    check_fields,
    encode_sse,
    expect,
    expect_objects,
    join_text,
    refuse_chat_tool_calls,
    shown,
)

__all__ = ["DialectError", "StreamTranslator", "check_request", "dropped_keys", "encode_sse", "from_chat_response",
           "hash_items", "to_chat_request"]

TRANSLATED_KEYS = frozenset({"model", "messages", "system", "max_tokens", "temperature", "top_p", "top_k",
                             "stop_sequences", "stream", "tools", "tool_choice", "thinking"})
# Server tools (web search, code execution, ...) run at Anthropic; only custom tools reach a model.
_CUSTOM_TOOL_TYPES = (None, "custom")
# The JSON type of each translated top-level field, as the Anthropic API requires it.
_FIELD_KINDS = {"model": "string", "max_tokens": "integer", "temperature": "number", "top_p": "number",
                "top_k": "integer", "stream": "boolean", "stop_sequences": "array", "tools": "array",
                "tool_choice": "object", "thinking": "object"}
_FIELD_HINTS = {"stop_sequences": "a list of strings", "tools": "a list of tool objects",
                "tool_choice": 'e.g. {"type": "auto"}', "thinking": 'e.g. {"type": "enabled", "budget_tokens": 1024}'}


def dropped_keys(body: dict) -> list[str]:
    """Request keys ``to_chat_request`` does not send upstream (``metadata``, ``betas``, ...).

    ``tool_choice.disable_parallel_tool_use`` is listed too: chat's ``parallel_tool_calls``
    is not sent (the Responses dialect drops it as well; vLLM's parsers decide).
    """
    out = [k for k in body if k not in TRANSLATED_KEYS]
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and "disable_parallel_tool_use" in choice:
        out.append("tool_choice.disable_parallel_tool_use")
    return out


def to_chat_request(body: dict) -> dict:
    """The chat-completions request for an Anthropic Messages request (see the module docstring)."""
    if not isinstance(body, dict):
        raise DialectError("the Anthropic request body must be a JSON object")
    messages = _messages(body)
    check_fields(body, _FIELD_KINDS, _FIELD_HINTS)
    out: dict[str, Any] = {}
    if "model" in body:
        out["model"] = body["model"]
    chat: list[dict] = []
    system = system_text(body.get("system"))
    if system is not None:
        chat.append({"role": "system", "content": system})
    for i, message in enumerate(messages):
        chat.extend(_message(message, i))
    out["messages"] = chat
    if chat and chat[-1]["role"] == "assistant":
        # Anthropic prefill: the answer continues the last assistant turn.
        out["continue_final_message"] = True
        out["add_generation_prompt"] = False
    for key in ("max_tokens", "temperature", "top_p", "top_k"):
        if body.get(key) is not None:
            out[key] = body[key]
    if body.get("stop_sequences"):
        for i, stop in enumerate(body["stop_sequences"]):
            expect(stop, "string", f"stop_sequences[{i}]")
        out["stop"] = list(body["stop_sequences"])
    if body.get("stream"):
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}  # message_delta reports output_tokens
    tools = [_tool(t) for t in expect_objects(body.get("tools") or [], "tools", "tool") if _is_custom_tool(t)]
    if tools:
        out["tools"] = tools
        if body.get("tool_choice") is not None:
            out["tool_choice"] = _tool_choice(body["tool_choice"])
    thinking = body.get("thinking")
    if thinking is not None:
        kind = thinking.get("type") if isinstance(thinking, dict) else None
        if kind not in ("enabled", "adaptive", "disabled"):
            raise DialectError(f"unknown thinking type {kind!r} (expected enabled, adaptive or disabled)")
        # budget_tokens is not enforced upstream: vLLM 0.33 has no thinking budget.
        out["chat_template_kwargs"] = {"enable_thinking": kind != "disabled"}
    return out


def check_request(body: dict) -> None:
    """What the Anthropic API refuses beyond what ``to_chat_request`` cannot translate (the interceptor calls both).

    ``messages: []`` translates (to a system-only chat request), but the Anthropic API answers it with
    400 "at least one message is required", and so does the interceptor.
    """
    if not _messages(body):
        raise DialectError("'messages' is empty: at least one message is required (as the Anthropic API requires)")


def _messages(body: dict) -> list:
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise DialectError(f"'messages' must be a list of message objects, got {shown(messages)}")
    return messages


def system_text(system: Any) -> str | None:
    """The system prompt as one string (text blocks joined with ``"\\n"``), or None."""
    if system is None:
        return None
    if isinstance(system, str):
        return system
    if not isinstance(system, list):
        raise DialectError("'system' must be a string or a list of text blocks")
    texts = []
    for block in system:
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            raise DialectError(f"unsupported system block type {kind!r}: only text blocks are allowed")
        texts.append(block["text"])
    return join_text(texts)


def _blocks(content: Any, where: str) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise DialectError(f"{where}: content must be a string or a list of content block objects, got "
                           f"{shown(content)}")
    for j, block in enumerate(content):
        if not isinstance(block, dict):
            raise DialectError(f"'{where}.content[{j}]' must be a content block object such as "
                               f'{{"type": "text", "text": "..."}}, got {shown(block)}')
    return content


def _message(message: Any, i: int) -> list[dict]:
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise DialectError(f"'{where}' must be a message object such as {{\"role\": \"user\", \"content\": \"...\"}}, "
                           f"got {shown(message)}")
    refuse_chat_tool_calls(message, where, 'tool_use content blocks')
    role = message.get("role")
    if role == "assistant":
        return [_assistant(_blocks(message.get("content"), where), where)]
    if role == "system":  # Claude Code sometimes sends these inside messages
        return [{"role": "system", "content": _user_content(_blocks(message.get("content"), where), where)}]
    if role != "user":
        raise DialectError(f"{where}: unknown role {role!r} (expected user, assistant or system)")
    content = message.get("content")
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    blocks = _blocks(content, where)
    out: list[dict] = []
    rest: list[dict] = []
    for block in blocks:
        if block.get("type") == "tool_result":
            if rest:
                raise DialectError(f"{where}: tool_result blocks must come first in a user message "
                                   "(as the Anthropic API requires)")
            out.append(_tool_result(block, where))
        else:
            rest.append(block)
    if rest:
        out.append({"role": "user", "content": _user_content(rest, where, first=len(out))})
    return out


def _user_content(blocks: list[dict], where: str, first: int = 0) -> str | list[dict]:
    """Chat content of user/system blocks; ``first`` is the index of ``blocks[0]`` in the message's content."""
    parts: list[dict] = []
    for j, block in enumerate(blocks):
        kind = block.get("type")
        if kind == "text":
            parts.append({"type": "text", "text": _text(block, where)})
        elif kind == "image":
            url = _image_url(block, f"{where}.content[{first + j}]")
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            raise DialectError(f"{where}: unsupported content block type {kind!r} (user and system messages "
                               "may hold text, image and leading tool_result blocks)")
    if all(p["type"] == "text" for p in parts):
        return join_text([p["text"] for p in parts])
    return parts


def _text(block: dict, where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise DialectError(f"{where}: a text block needs a string 'text'")
    return text


def _image_url(block: dict, where: str) -> str:
    source = block.get("source")
    if not isinstance(source, dict):
        raise DialectError(f"'{where}.source' (an image block's source) must be an object, {{\"type\": \"base64\", "
                           f"\"media_type\": ..., \"data\": ...}} or {{\"type\": \"url\", \"url\": ...}}, got "
                           f"{shown(source)}")
    if source.get("type") == "base64" and isinstance(source.get("data"), str):
        return f"data:{source.get('media_type', 'image/png')};base64,{source['data']}"
    if source.get("type") == "url" and isinstance(source.get("url"), str):
        return source["url"]
    raise DialectError(f"{where}: unsupported image source type {source.get('type')!r} (expected base64 or url)")


def _tool_result(block: dict, where: str) -> dict:
    tool_use_id = block.get("tool_use_id")
    if not isinstance(tool_use_id, str) or not tool_use_id:
        raise DialectError(f"{where}: a tool_result block needs 'tool_use_id'")
    content = block.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        texts = []
        for inner in content:
            kind = inner.get("type") if isinstance(inner, dict) else None
            if kind == "text":
                texts.append(_text(inner, where))
            elif kind == "image":
                texts.append(IMAGE_PLACEHOLDER)  # chat tool messages carry text only
            else:
                raise DialectError(f"{where}: unsupported block type {kind!r} inside a tool_result")
        text = join_text(texts)
    else:
        raise DialectError(f"{where}: tool_result content must be a string or a list of blocks")
    return {"role": "tool", "tool_call_id": tool_use_id, "content": text}


def _assistant(blocks: list[dict], where: str) -> dict:
    reasoning: list[str] = []
    texts: list[str] = []
    calls: list[dict] = []
    for block in blocks:
        kind = block.get("type")
        if kind == "text":
            texts.append(_text(block, where))
        elif kind == "thinking":
            if not isinstance(block.get("thinking"), str):
                raise DialectError(f"{where}: a thinking block needs a string 'thinking'")
            reasoning.append(block["thinking"])
        elif kind == "redacted_thinking":
            continue  # opaque Anthropic ciphertext: nothing a local model generated
        elif kind == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise DialectError(f"{where}: a tool_use block needs string 'id' and 'name'")
            arguments = json.dumps(block.get("input", {}), ensure_ascii=False)
            calls.append({"id": block["id"], "type": "function",
                          "function": {"name": block["name"], "arguments": arguments}})
        else:
            raise DialectError(f"{where}: unsupported content block type {kind!r} in an assistant message")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    if reasoning:
        message["reasoning"] = "".join(reasoning)
    return message


def _is_custom_tool(tool: Any) -> bool:
    if not isinstance(tool, dict):
        raise DialectError("each tool must be an object")
    return tool.get("type") in _CUSTOM_TOOL_TYPES


def _tool(tool: dict) -> dict:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise DialectError("a custom tool needs a 'name'")
    if not isinstance(tool.get("input_schema"), dict):
        raise DialectError(f"tool {name!r} needs an 'input_schema' object")
    function: dict[str, Any] = {"name": name}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    function["parameters"] = tool["input_schema"]
    if tool.get("strict") is not None:
        function["strict"] = tool["strict"]
    return {"type": "function", "function": function}


def _tool_choice(choice: Any) -> Any:
    expect(choice, "object", "tool_choice", 'e.g. {"type": "auto"}')
    kind = choice.get("type")
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise DialectError(f"unsupported tool_choice {choice!r} (expected auto, any, tool or none)")


def hash_items(body: dict) -> tuple[list[dict], Any, Any]:
    """(items, instructions, tools) the interceptor hashes for lineage (``schemas.hashing``).

    Items are the Anthropic ``messages`` as given, minus what changes between turns without
    changing the conversation: ``cache_control`` (Claude Code moves its breakpoints every
    turn) and ``thinking`` / ``redacted_thinking`` blocks (reasoning is never hashed: the
    chat output items put it in a separate item that fingerprints skip). Instructions are
    ``system_text``; tools are the request's tools without ``cache_control``.
    """
    messages = _messages(body)
    items = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise DialectError(f"'messages[{i}]' must be a message object, got {shown(message)}")
        content = message.get("content")
        if isinstance(content, list):
            content = [_strip_block(b) for b in content
                       if not (isinstance(b, dict) and b.get("type") in ("thinking", "redacted_thinking"))]
            message = {**message, "content": content}
        items.append(message)
    tools = body.get("tools")
    if isinstance(tools, list):
        tools = [_strip_block(t) for t in tools]
    return items, system_text(body.get("system")), tools


def _strip_block(block: Any) -> Any:
    if not isinstance(block, dict):
        return block
    out = {k: v for k, v in block.items() if k != "cache_control"}
    if block.get("type") == "tool_result" and isinstance(block.get("content"), list):
        out["content"] = [_strip_block(b) for b in block["content"]]
    return out
