"""OpenAI Responses API <-> OpenAI chat completions (pure; the request side lives here).

Used for Codex and ``client.responses.create``. The answer side is in
``responses_output`` and ``responses_stream`` (re-exported here).

Guarantees of ``to_chat_request``:

* ``instructions`` becomes a leading system message; ``input`` items become chat messages
  in order. ``developer`` and ``system`` messages become system messages.
* Consecutive model-authored items (a ``reasoning`` item, an assistant ``message``, its
  ``function_call`` items) become ONE chat assistant message (reasoning, content,
  tool_calls): that is how the model produced them, so the echo re-renders the same
  tokens. A reasoning item, or an assistant message after content or calls, starts a new
  assistant turn. Reasoning text comes from ``content[].reasoning_text`` only: a summary
  is not what the model generated, so a summary-only item contributes nothing.
* ``function_call.arguments`` goes upstream verbatim (the exact text the model generated).
* Text-only content of a non-assistant message becomes one string joined with ``"\\n"``
  (vLLM's own join of text parts); assistant text parts are concatenated.
* Stateful requests (``previous_response_id``, ``conversation``, ``background``, stored
  ``prompt`` templates) raise ``DialectError``: token capture needs the full input in
  every request. Other untranslated top-level keys are dropped; ``dropped_keys`` lists them.
* Function tools become chat tools, and so do the function tools of a ``namespace`` tool,
  under their bare names (unique across the request, else ``DialectError``; see
  ``responses_output``); hosted tools (``web_search``, ``custom``, ...) are skipped;
  ``tool_choice`` is sent only when a function tool is. Streaming asks for
  ``stream_options.include_usage`` (the final Response carries usage).
* A ``function_call`` input item's ``namespace`` (a string when present) is not sent
  upstream: the model generated the bare name, and lineage hashes the bare name too.
* Items this translator does not know (multi-agent v2's ``agent_message``, a content part
  such as ``encrypted_content``) raise ``DialectError`` naming ``input[i]`` (a 400).
* ``reasoning.effort``: absent ``reasoning`` leaves the upstream default; effort ``"none"``
  (or null) sends ``enable_thinking: false``; any other effort sends ``true``.
"""

from __future__ import annotations

from typing import Any

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
from producers.dialects.responses_output import chat_tools, from_chat_response
from producers.dialects.responses_stream import StreamTranslator

__all__ = ["DialectError", "StreamTranslator", "dropped_keys", "encode_sse", "from_chat_response",
           "hash_items", "to_chat_request"]

TRANSLATED_KEYS = frozenset({"model", "input", "instructions", "tools", "tool_choice", "max_output_tokens",
                             "temperature", "top_p", "stream", "reasoning", "text"})
_STATEFUL = {
    "previous_response_id": "previous_response_id is not supported: token capture needs stateless requests "
                            "that carry the full input (store=false); a later version may support it",
    "conversation": "conversation is not supported: token capture needs the full input in every request",
    "prompt": "stored prompt templates are not supported: token capture needs the full input in every request",
}


# The JSON type of each translated top-level field, as the OpenAI Responses API requires it.
_FIELD_KINDS = {"model": "string", "instructions": "string", "tools": "array", "max_output_tokens": "integer",
                "temperature": "number", "top_p": "number", "stream": "boolean", "reasoning": "object",
                "text": "object"}
_FIELD_HINTS = {"tools": "a list of tool objects", "reasoning": 'e.g. {"effort": "low"}',
                "text": 'e.g. {"format": {"type": "text"}}'}


def dropped_keys(body: dict) -> list[str]:
    """Request keys ``to_chat_request`` does not send upstream (``store``, ``include``, ...)."""
    return [k for k in body if k not in TRANSLATED_KEYS]


def to_chat_request(body: dict) -> dict:
    """The chat-completions request for a Responses request (see the module docstring)."""
    if not isinstance(body, dict):
        raise DialectError("the Responses request body must be a JSON object")
    for key, message in _STATEFUL.items():
        if body.get(key) is not None:
            raise DialectError(message)
    if body.get("background"):
        raise DialectError("background responses are not supported: the interceptor must see the answer")
    check_fields(body, _FIELD_KINDS, _FIELD_HINTS)
    out: dict[str, Any] = {}
    if "model" in body:
        out["model"] = body["model"]
    messages: list[dict] = []
    instructions = body.get("instructions")
    if instructions is not None:
        messages.append({"role": "system", "content": instructions})
    messages.extend(_input_messages(input_items(body)))
    out["messages"] = messages
    if body.get("max_output_tokens") is not None:
        out["max_tokens"] = body["max_output_tokens"]
    for key in ("temperature", "top_p"):
        if body.get(key) is not None:
            out[key] = body[key]
    if body.get("stream"):
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}  # the final Response carries usage
    tools = chat_tools(body.get("tools"))
    if tools:
        out["tools"] = tools
        if body.get("tool_choice") is not None:
            out["tool_choice"] = _tool_choice(body["tool_choice"])
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and "effort" in reasoning:
        out["chat_template_kwargs"] = {"enable_thinking": reasoning["effort"] not in (None, "none")}
    response_format = _response_format(body.get("text"))
    if response_format is not None:
        out["response_format"] = response_format
    return out


def input_items(body: dict) -> list[dict]:
    """``input`` as a list of items (a string is one user message)."""
    value = body.get("input")
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if not isinstance(value, list):
        raise DialectError(f"'input' must be a string or a list of item objects, got {shown(value)}")
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise DialectError(f"'input[{i}]' must be an item object such as {{\"role\": \"user\", \"content\": "
                               f"\"...\"}}, got {shown(item)}")
    return value


def hash_items(body: dict) -> tuple[list[dict], Any, Any]:
    """(input items as given, ``instructions``, ``tools``) for lineage hashing.

    Nothing needs stripping: ids and statuses are not hashed, function_call items hash
    like chat tool calls by ``call_id``, and reasoning items are skipped by fingerprints.
    """
    return list(input_items(body)), body.get("instructions"), body.get("tools")


def _kind(item: dict) -> Any:
    return item.get("type") or ("message" if "role" in item else None)


def _input_messages(items: list[dict]) -> list[dict]:
    messages: list[dict] = []
    turn: dict[str, Any] | None = None  # the assistant message being assembled

    def flush() -> None:
        nonlocal turn
        if turn is not None and (turn["reasoning"] or turn["content"] is not None or turn["tool_calls"]):
            message: dict[str, Any] = {"role": "assistant", "content": turn["content"]}
            if turn["tool_calls"]:
                message["tool_calls"] = turn["tool_calls"]
            if turn["reasoning"]:
                message["reasoning"] = turn["reasoning"]
            messages.append(message)
        turn = None

    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = _kind(item)
        refuse_chat_tool_calls(item, where, "function_call items")
        if kind == "reasoning":
            flush()
            turn = {"reasoning": _reasoning_text(item, where), "content": None, "tool_calls": []}
        elif kind == "message" and item.get("role") == "assistant":
            if turn is not None and (turn["content"] is not None or turn["tool_calls"]):
                flush()
            turn = turn or {"reasoning": None, "content": None, "tool_calls": []}
            turn["content"] = _assistant_text(item.get("content"), where)
        elif kind == "function_call":
            turn = turn or {"reasoning": None, "content": None, "tool_calls": []}
            turn["tool_calls"].append(_function_call(item, where))
        else:
            flush()
            messages.append(_other(item, kind, where))
    flush()
    return messages


def _reasoning_text(item: dict, where: str) -> str | None:
    content = item.get("content")
    if content is not None:
        expect_objects(content, f"{where}.content", "reasoning_text part")
    texts = [p.get("text") for p in content or []
             if p.get("type") == "reasoning_text" and isinstance(p.get("text"), str)]
    return "".join(texts) if texts else None


def _assistant_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    expect_objects(content, f"{where}.content", "output_text part")
    texts = []
    for part in content:
        kind = part.get("type")
        if kind not in ("output_text", "input_text") or not isinstance(part.get("text"), str):
            raise DialectError(f"{where}: unsupported assistant content part type {kind!r}")
        texts.append(part["text"])
    return "".join(texts)


def _function_call(item: dict, where: str) -> dict:
    call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
    if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(arguments, str):
        raise DialectError(f"{where}: a function_call item needs string call_id, name and arguments")
    namespace = item.get("namespace")
    if namespace is not None and not isinstance(namespace, str):
        raise DialectError(f"'{where}.namespace' must be a string (the namespace tool's name, e.g. "
                           f"\"multi_agent_v1\"), got {shown(namespace)}")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _other(item: dict, kind: Any, where: str) -> dict:
    if kind == "function_call_output":
        if not isinstance(item.get("call_id"), str):
            raise DialectError(f"{where}: a function_call_output item needs a string call_id")
        output = item.get("output")
        text = output if isinstance(output, str) else _output_text(output, where)
        return {"role": "tool", "tool_call_id": item["call_id"], "content": text}
    if kind != "message":
        raise DialectError(f"{where}: unsupported input item type {kind!r} (expected message, reasoning, "
                           "function_call or function_call_output)")
    role = item.get("role")
    if role not in ("user", "system", "developer"):
        raise DialectError(f"{where}: unknown message role {role!r}")
    # Open models' templates know no "developer" role; it is the system role there.
    return {"role": "user" if role == "user" else "system", "content": _content(item.get("content"), where)}


def _content(content: Any, where: str) -> str | list[dict]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise DialectError(f"'{where}.content' must be a string or a list of content part objects, got "
                           f"{shown(content)}")
    expect_objects(content, f"{where}.content", "content part")
    parts: list[dict] = []
    for part in content:
        kind = part.get("type")
        if kind in ("input_text", "output_text") and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            image: dict[str, Any] = {"url": part["image_url"]}
            if part.get("detail") not in (None, "auto"):
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        else:
            raise DialectError(f"{where}: unsupported content part type {kind!r} (expected input_text, or "
                               "input_image with an image_url)")
    if all(p["type"] == "text" for p in parts):
        return join_text([p["text"] for p in parts])
    return parts


def _output_text(output: Any, where: str) -> str:
    if not isinstance(output, list):
        raise DialectError(f"'{where}.output' (function_call_output) must be a string or a list of content part "
                           f"objects, got {shown(output)}")
    expect_objects(output, f"{where}.output", "content part")
    texts = []
    for part in output:
        kind = part.get("type")
        if kind in ("input_text", "output_text") and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "input_image":
            texts.append(IMAGE_PLACEHOLDER)  # chat tool messages carry text only
        else:
            raise DialectError(f"{where}: unsupported function_call_output part type {kind!r}")
    return join_text(texts)


def _tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise DialectError(f"unsupported tool_choice {choice!r} (expected auto, none, required or a function)")


def _response_format(text: Any) -> dict | None:
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is not None:
        expect(fmt, "object", "text.format", 'e.g. {"type": "json_schema", "name": ..., "schema": ...}')
    if fmt is None or fmt.get("type") in (None, "text"):
        return None
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    if fmt["type"] == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if fmt.get(k) is not None}
        return {"type": "json_schema", "json_schema": schema}
    raise DialectError(f"unsupported text.format type {fmt['type']!r}")
