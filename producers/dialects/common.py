"""Shared pieces of the dialect translators: errors, SSE framing, reading vLLM chat output (pure).

Guarantees:

* Only the stdlib and ``schemas`` are imported: the translators are pure functions of their inputs.
* Reading never copies a token field (``prompt_token_ids``, ``token_ids``, ``logprobs``)
  anywhere; their lengths are used only as a usage fallback when the engine sent no
  ``usage``.
* A chat response or chunk that cannot be translated faithfully (more than one choice,
  a tool-call delta without id or name, interleaved tool calls) raises ``DialectError``
  (a ``ValueError``) with a message naming the problem.
* Stream chunks are read by ``producers.dialects.chat_chunks`` (one reader for the capture
  and the translators).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from schemas.errors import TokentrailError

IMAGE_PLACEHOLDER = "[image]"

# Chat finish reasons the dialects can express. vLLM's "repetition" (its repetition detector
# stopped a generation whose tokens were really sampled) ends a turn like "stop". Anything else
# (vLLM "abort", "error") means the generation did not end normally: the interceptor records
# it before translating, and a translator refuses it rather than guess.
KNOWN_FINISH_REASONS = ("stop", "length", "tool_calls", "content_filter", "repetition")


class DialectError(ValueError, TokentrailError):
    """A request or upstream answer that cannot be translated faithfully (the caller answers 400/502).

    A ``ValueError`` (what adapters raise for a bad request) and a ``TokentrailError`` (ours)."""


# -- request field checks (the caller answers 400 with the message) ------------------------

_JSON_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool}


def json_type(value: Any) -> str:
    """The JSON name of a decoded value's type (object, array, string, number, boolean, null)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def is_kind(value: Any, kind: str) -> bool:
    """Whether ``value`` is a JSON ``kind``: object, array, string, boolean, integer or number."""
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, _JSON_TYPES[kind])


def shown(value: Any, limit: int = 60) -> str:
    """A value for an error message: its JSON type and a short repr."""
    if value is None or isinstance(value, bool):
        return json_type(value) if value is None else f"boolean {str(value).lower()}"
    text = repr(value)
    return f"{json_type(value)} {text if len(text) <= limit else text[:limit - 3] + '...'}"


def refuse_chat_tool_calls(item: dict, where: str, instead: str) -> None:
    """A ``tool_calls`` key on a non-chat item is refused (400), never read: it is chat's field, and
    lineage hashing (``schemas.hashing``, Gym-compatible) would read it as the item's tool calls."""
    if "tool_calls" in item:
        raise DialectError(f"'{where}.tool_calls' is not a field of this API (it is chat completions'); "
                           f"send tool calls as {instead}, got {shown(item['tool_calls'])}")


def expect(value: Any, kind: str, where: str, hint: str = "") -> Any:
    """``value`` when it is a JSON ``kind``; DialectError naming ``where``, the value and the fix otherwise."""
    if not is_kind(value, kind):
        article = "an" if kind[0] in "aeiou" else "a"
        raise DialectError(f"'{where}' must be {article} {kind}{f' ({hint})' if hint else ''}, got {shown(value)}")
    return value


def check_fields(body: dict, kinds: dict[str, str], hints: dict[str, str] | None = None) -> None:
    """Each present, non-null top-level field of ``body`` has its JSON kind (``expect``)."""
    for key, kind in kinds.items():
        value = body.get(key)
        if value is not None:
            expect(value, kind, key, (hints or {}).get(key, ""))


def expect_objects(value: Any, where: str, what: str) -> list:
    """``value`` as a list whose every element is an object; else DialectError naming the first bad one."""
    expect(value, "array", where, f"a list of {what} objects")
    for i, element in enumerate(value):
        if not isinstance(element, dict):
            raise DialectError(f"'{where}[{i}]' must be an object ({what}), got {shown(element)}")
    return value


def compact_json(data: Any) -> bytes:
    """``data`` as compact JSON in UTF-8 (no spaces, non-ASCII as itself): the bytes of an SSE event's data."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()


def encode_sse(event: str, data: dict, dumps: Callable[[Any], bytes] = compact_json) -> bytes:
    """One SSE event, ``event: X\\ndata: {json}\\n\\n``; ``dumps`` makes ``compact_json``'s bytes (the HTTP
    edge passes orjson's, which are the same: ``tests/unit/producers/dialects/test_sse_encoding.py``)."""
    return b"event: " + event.encode() + b"\ndata: " + dumps(data) + b"\n\n"


def encode_sse_data(event: str, data: dict, dumps: Callable[[Any], bytes] = compact_json) -> bytes:
    """One SSE event without a name, ``data: {json}\\n\\n`` (Gemini's streams); ``event`` is ignored."""
    return b"data: " + dumps(data) + b"\n\n"


def join_text(texts: list[str]) -> str:
    """Several text parts of one non-assistant message as one string.

    ``"\\n"`` is what vLLM itself joins text parts with for string-content chat templates
    (almost every open model's), so a string built here renders exactly like the parts.
    """
    return "\n".join(texts)


def reasoning_of(message: dict) -> str | None:
    """vLLM 0.33's ``reasoning`` (older servers: ``reasoning_content``)."""
    value = message.get("reasoning")
    if value is None:
        value = message.get("reasoning_content")
    return value if isinstance(value, str) else None


def check_finish_reason(reason: Any) -> str:
    if reason not in KNOWN_FINISH_REASONS:
        raise DialectError(f"upstream finish_reason {reason!r} has no equivalent in the client's dialect "
                           f"(expected one of {', '.join(KNOWN_FINISH_REASONS)})")
    return reason


@dataclass(frozen=True, slots=True)
class ChatOutput:
    """The one choice of a non-streaming chat completion, read defensively."""

    reasoning: str | None
    content: str | None
    tool_calls: list[tuple[str, str, str]]  # (id, name, arguments text)
    finish_reason: str
    stop_reason: Any
    prompt_tokens: int
    completion_tokens: int
    created: int | None


def read_chat_response(chat: dict) -> ChatOutput:
    if not isinstance(chat, dict):
        raise DialectError("upstream chat completion must be a JSON object")
    choices = chat.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        raise DialectError("upstream chat completion must have exactly one choice (token capture needs n=1)")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise DialectError("upstream chat completion choice has no message object")
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not call.get("id"):
            raise DialectError("upstream tool call needs id and function.name")
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            raise DialectError(f"upstream tool call {function['name']!r} has non-string arguments")
        calls.append((str(call["id"]), function["name"], arguments))
    content = message.get("content")
    usage = chat.get("usage")
    if not isinstance(usage, dict):
        usage = {}
    prompt = usage.get("prompt_tokens")
    completion = usage.get("completion_tokens")
    if not isinstance(prompt, int):
        prompt = len(chat["prompt_token_ids"]) if isinstance(chat.get("prompt_token_ids"), list) else 0
    if not isinstance(completion, int):
        completion = len(choice["token_ids"]) if isinstance(choice.get("token_ids"), list) else 0
    created = chat.get("created")
    return ChatOutput(
        reasoning=reasoning_of(message),
        content=content if isinstance(content, str) else None,
        tool_calls=calls,
        finish_reason=check_finish_reason(choice.get("finish_reason")),
        stop_reason=choice.get("stop_reason"),
        prompt_tokens=prompt,
        completion_tokens=completion,
        created=created if isinstance(created, int) else None,
    )
