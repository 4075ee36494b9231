"""OpenAI chat completions, the engine's own dialect: checked, passed through, ids renamed.

Guarantees: ``ChatAdapter.parse`` refuses (``DialectError``, a ``ValueError`` naming the
field) a request whose parts the interceptor reads (messages, tools, the fields in
``_CHAT_FIELDS``) do not have the chat API's shape, and any ``n`` other than 1 (token
capture needs one choice per call); everything else is left to the engine. Answers and
stream chunks reach the client minus every token field, under the call's response id;
``logprobs`` only when the harness asked for them. Only ``[DONE]`` waits until the
capture is durable.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

from producers.dialects.base import ParsedRequest, SpecAdapter, StreamAdapter
from producers.dialects.common import DialectError, check_fields, expect, expect_objects, shown
from producers.engine.extract import CHOICE_TOKEN_FIELDS, TOP_LEVEL_TOKEN_FIELDS, strip_chat_response
from producers.engine.info import engine_message
from producers.http.replies import error_response, json_response

__all__ = ["DONE", "ChatAdapter", "ChatStreamAdapter", "check_chat_request"]

DONE = b"data: [DONE]\n\n"

# Top-level chat fields whose JSON type the interceptor itself relies on (the engine checks the rest).
_CHAT_FIELDS = {"model": "string", "stream": "boolean", "logprobs": "boolean", "top_logprobs": "integer",
                "max_tokens": "integer", "max_completion_tokens": "integer", "stream_options": "object"}
# A tool's parameters are a JSON Schema; the engine's tool parsers crash on anything else (issue 26).
_PARAMETERS_HINT = 'a JSON Schema, e.g. {"type": "object", "properties": {}}'


class ChatAdapter(SpecAdapter):
    """OpenAI chat completions: passed through, minus token fields, under the call's response id."""

    def parse(self, body: dict[str, Any], *, api_path: str = "", query: str = "") -> ParsedRequest:
        check_chat_request(body)
        messages = body["messages"]
        system = [m.get("content") for m in messages if m.get("role") in ("system", "developer")]
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
        return error_response(status, message, kind)

    def upstream_error(self, status: int, content: bytes) -> Response:
        # The engine's JSON error as it sent it; a body that is not JSON (a proxy's or a crashed engine's plain
        # text) is wrapped in the chat error shape rather than labelled application/json (issue 26).
        try:
            orjson.loads(content)
        except orjson.JSONDecodeError:
            return self.error(status, engine_message(content), "server_error" if status >= 500 else
                              "invalid_request_error")
        return Response(content, status_code=status, media_type="application/json")


class ChatStreamAdapter:
    """Chat clients get the engine's chunks, minus token fields, under the call's response id."""

    def __init__(self, response_id: str, *, keep_logprobs: bool) -> None:
        self.response_id = response_id
        self.keep_logprobs = keep_logprobs

    def feed(self, chunk: dict[str, Any], read: Any = None) -> bytes:
        # In place: the chunk is this call's own, already read by the capture (one per streamed token, so
        # no copies of it).
        for key in TOP_LEVEL_TOKEN_FIELDS:
            chunk.pop(key, None)
        chunk["id"] = self.response_id
        for choice in chunk.get("choices") or ():
            for key in CHOICE_TOKEN_FIELDS:
                choice.pop(key, None)
            if not self.keep_logprobs and "logprobs" in choice:
                choice["logprobs"] = None
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    def finish(self) -> tuple[bytes, bytes]:
        return b"", DONE

    def error(self, status: int, message: str, kind: str = "capture_error") -> bytes:
        return b"data: " + orjson.dumps({"error": {"message": message, "type": kind, "code": status}}) + b"\n\n"


def check_chat_request(body: dict[str, Any]) -> None:
    """DialectError naming the field unless what the interceptor reads has the chat API's shape."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise DialectError(f"'messages' must be a list of message objects, got {shown(messages)}")
    check_fields(body, _CHAT_FIELDS)
    if body.get("tools") is not None:
        for i, tool in enumerate(expect_objects(body["tools"], "tools", "tool")):
            function = tool.get("function")
            if isinstance(function, dict) and function.get("parameters") is not None:
                expect(function["parameters"], "object", f"tools[{i}].function.parameters", _PARAMETERS_HINT)
    for i, message in enumerate(messages):
        _check_chat_message(message, f"messages[{i}]")
    if body.get("n") not in (None, 1):
        raise DialectError(f"n={body.get('n')!r}: token capture needs exactly one choice per call (n=1)")


def _check_chat_message(message: Any, where: str) -> None:
    """What hashing and forwarding read of a chat message has the shape the chat API gives it."""
    if not isinstance(message, dict):
        raise DialectError(f"'{where}' must be a message object such as {{\"role\": \"user\", \"content\": "
                           f"\"...\"}}, got {shown(message)}")
    expect(message.get("role"), "string", f"{where}.role", "system, developer, user, assistant or tool")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        if not isinstance(content, list):
            raise DialectError(f"'{where}.content' must be a string or a list of content part objects, got "
                               f"{shown(content)}")
        for j, part in enumerate(content):
            at = f"{where}.content[{j}]"
            if not isinstance(part, dict):
                raise DialectError(f"'{at}' must be a content part object such as {{\"type\": \"text\", "
                                   f"\"text\": \"...\"}}, got {shown(part)}")
            if part.get("type") is not None:
                expect(part["type"], "string", f"{at}.type")
            elif not isinstance(part.get("text"), str):
                raise DialectError(f"'{at}' needs a string 'type' (or, untyped, a string 'text')")
    calls = message.get("tool_calls")
    if calls is not None:
        for k, call in enumerate(expect_objects(calls, f"{where}.tool_calls", "tool call")):
            function = call.get("function")
            if function is not None:
                expect(function, "object", f"{where}.tool_calls[{k}].function", "name and arguments")
                if function.get("name") is not None:
                    expect(function["name"], "string", f"{where}.tool_calls[{k}].function.name")
