"""Dialect adapters: what differs between OpenAI chat, Anthropic Messages and OpenAI Responses.

Every dialect is served by the same capture core against the engine's
chat-completions route (vLLM's own /v1/messages returns no token ids). An
adapter parses the harness's request into chat terms plus the items lineage
hashes, renders the engine's answer back, translates a stream event by event
(holding back only the terminal event), and shapes errors the way the
dialect's SDK expects them.
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson
from starlette.responses import Response

from producers.core import ParsedRequest
from producers.dialects.common import check_fields, expect, expect_objects, shown
from producers.extract import strip_chat_response
from producers.http import json_response
from producers.streaming import ChatStreamAdapter
from schemas.records import Dialect


class StreamAdapter(Protocol):
    def feed(self, chunk: dict[str, Any]) -> bytes:
        """Bytes to send now for one engine chunk (may be empty)."""

    def finish(self) -> tuple[bytes, bytes]:
        """(the last non-terminal bytes, the terminal event) once the capture is durable."""

    def error(self, status: int, message: str, kind: str = "capture_error") -> bytes:
        """An error event that ends the stream instead of the terminal event."""


class DialectAdapter(Protocol):
    dialect: Dialect
    id_kind: str

    def parse(self, body: dict[str, Any]) -> ParsedRequest:
        """Raise ValueError with a message naming the field for a request this dialect cannot serve."""

    def render(self, data: dict[str, Any], response_id: str, parsed: ParsedRequest) -> Response:
        """The harness's answer; ValueError (DialectError) when the engine's answer cannot be expressed."""

    def stream_adapter(self, response_id: str, parsed: ParsedRequest) -> StreamAdapter: ...

    def error(self, status: int, message: str, kind: str) -> Response: ...

    def upstream_error(self, status: int, content: bytes) -> Response: ...


class ChatAdapter:
    """OpenAI chat completions: passed through, minus token fields, under the call's response id."""

    dialect = Dialect.CHAT_COMPLETIONS
    id_kind = "chat"

    def parse(self, body: dict[str, Any]) -> ParsedRequest:
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise ValueError(f"'messages' must be a list of message objects, got {shown(messages)}")
        check_fields(body, _CHAT_FIELDS)
        if body.get("tools") is not None:
            expect_objects(body["tools"], "tools", "tool")
        for i, message in enumerate(messages):
            _check_chat_message(message, f"messages[{i}]")
        if body.get("n") not in (None, 1):
            raise ValueError(f"n={body.get('n')!r}: token capture needs exactly one choice per call (n=1)")
        system = [m.get("content") for m in messages if isinstance(m, dict) and m.get("role") in ("system", "developer")]
        return ParsedRequest(
            chat_body=body, items=messages, tools=body.get("tools"), system=system or None,
            stream=bool(body.get("stream")), keep_logprobs=bool(body.get("logprobs")),
        )

    def render(self, data: dict[str, Any], response_id: str, parsed: ParsedRequest) -> Response:
        clean = strip_chat_response(data, keep_logprobs=parsed.keep_logprobs)
        clean["id"] = response_id
        return json_response(clean)

    def stream_adapter(self, response_id: str, parsed: ParsedRequest) -> StreamAdapter:
        return ChatStreamAdapter(response_id, keep_logprobs=parsed.keep_logprobs)

    def error(self, status: int, message: str, kind: str) -> Response:
        return json_response({"error": {"message": message, "type": kind, "code": status}}, status)

    def upstream_error(self, status: int, content: bytes) -> Response:
        return Response(content, status_code=status, media_type="application/json")


# Top-level chat fields whose JSON type the interceptor itself relies on (the engine checks the rest).
_CHAT_FIELDS = {"model": "string", "stream": "boolean", "logprobs": "boolean", "top_logprobs": "integer",
                "max_tokens": "integer", "max_completion_tokens": "integer", "stream_options": "object"}


def _check_chat_message(message: Any, where: str) -> None:
    """What hashing and forwarding read of a chat message has the shape the chat API gives it."""
    if not isinstance(message, dict):
        raise ValueError(f"'{where}' must be a message object such as {{\"role\": \"user\", \"content\": \"...\"}}, "
                         f"got {shown(message)}")
    expect(message.get("role"), "string", f"{where}.role", "system, developer, user, assistant or tool")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        if not isinstance(content, list):
            raise ValueError(f"'{where}.content' must be a string or a list of content part objects, got "
                             f"{shown(content)}")
        for j, part in enumerate(content):
            at = f"{where}.content[{j}]"
            if not isinstance(part, dict):
                raise ValueError(f"'{at}' must be a content part object such as {{\"type\": \"text\", \"text\": "
                                 f"\"...\"}}, got {shown(part)}")
            if part.get("type") is not None:
                expect(part["type"], "string", f"{at}.type")
            elif not isinstance(part.get("text"), str):
                raise ValueError(f"'{at}' needs a string 'type' (or, untyped, a string 'text')")
    calls = message.get("tool_calls")
    if calls is not None:
        for k, call in enumerate(expect_objects(calls, f"{where}.tool_calls", "tool call")):
            function = call.get("function")
            if function is not None:
                expect(function, "object", f"{where}.tool_calls[{k}].function", "name and arguments")
                if function.get("name") is not None:
                    expect(function["name"], "string", f"{where}.tool_calls[{k}].function.name")


def openai_error(status: int, message: str, kind: str) -> Response:
    return json_response({"error": {"message": message, "type": kind, "code": status}}, status)


def passthrough_json(status: int, content: bytes) -> Response:
    try:
        orjson.loads(content)
        return Response(content, status_code=status, media_type="application/json")
    except ValueError:
        return openai_error(status, content[:500].decode(errors="replace"), "upstream_error")
