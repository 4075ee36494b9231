"""Anthropic Messages and OpenAI Responses adapters over the pure translators in ``producers.dialects``.

The engine is always asked through chat completions (vLLM's own /v1/messages
returns no token ids); these adapters turn the harness's request into that, and
the engine's answer (or its stream, event by event) back into the harness's
dialect, with errors shaped the way each dialect's SDK reads them.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import Response

from producers.adapters import StreamAdapter
from producers.core import ParsedRequest
from producers.dialects import anthropic, responses
from producers.dialects.common import encode_sse
from producers.engine_info import engine_message as _engine_message
from producers.http import json_response
from schemas.records import Dialect

_ANTHROPIC_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                          404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                          503: "overloaded_error", 529: "overloaded_error"}


class _TranslatingStream:
    """Adapts a translator's (event, data) lists to bytes on the wire."""

    def __init__(self, translator: Any, error_event: Any) -> None:
        self._t = translator
        self._error_event = error_event

    def feed(self, chunk: dict[str, Any]) -> bytes:
        return b"".join(encode_sse(name, data) for name, data in self._t.feed(chunk))

    def finish(self) -> tuple[bytes, bytes]:
        rest, terminal = self._t.finish()
        return b"".join(encode_sse(n, d) for n, d in rest), encode_sse(*terminal)

    def error(self, status: int, message: str, kind: str = "capture_error") -> bytes:
        return self._error_event(status, message)


class AnthropicAdapter:
    dialect = Dialect.ANTHROPIC_MESSAGES
    id_kind = "anthropic"

    def parse(self, body: dict[str, Any]) -> ParsedRequest:
        anthropic.check_request(body)
        chat = anthropic.to_chat_request(body)
        items, instructions, tools = anthropic.hash_items(body)
        return ParsedRequest(chat_body=chat, items=items, instructions=instructions, tools=tools,
                             system=body.get("system"), stream=bool(body.get("stream")), original=body)

    def render(self, data: dict[str, Any], response_id: str, parsed: ParsedRequest) -> Response:
        # DialectError propagates: the core records it before any capture is written.
        return json_response(anthropic.from_chat_response(data, response_id=response_id,
                                                          model=str(parsed.original.get("model") or "")))

    def stream_adapter(self, response_id: str, parsed: ParsedRequest) -> StreamAdapter:
        translator = anthropic.StreamTranslator(response_id, str(parsed.original.get("model") or ""))
        return _TranslatingStream(translator, lambda status, message: encode_sse(
            "error", {"type": "error", "error": {"type": _ANTHROPIC_ERROR_TYPES.get(status, "api_error"),
                                                 "message": message}}))

    def error(self, status: int, message: str, kind: str) -> Response:
        kind = _ANTHROPIC_ERROR_TYPES.get(status, "api_error")
        return json_response({"type": "error", "error": {"type": kind, "message": message}}, status)

    def upstream_error(self, status: int, content: bytes) -> Response:
        return self.error(status, _engine_message(content), "api_error")


class ResponsesAdapter:
    dialect = Dialect.RESPONSES
    id_kind = "responses"

    def parse(self, body: dict[str, Any]) -> ParsedRequest:
        chat = responses.to_chat_request(body)
        items, instructions, tools = responses.hash_items(body)
        return ParsedRequest(chat_body=chat, items=items, instructions=instructions, tools=tools,
                             system=instructions, stream=bool(body.get("stream")), original=body)

    def render(self, data: dict[str, Any], response_id: str, parsed: ParsedRequest) -> Response:
        # DialectError propagates: the core records it before any capture is written.
        return json_response(responses.from_chat_response(
            data, response_id=response_id, model=str(parsed.original.get("model") or ""), request=parsed.original))

    def stream_adapter(self, response_id: str, parsed: ParsedRequest) -> StreamAdapter:
        translator = responses.StreamTranslator(response_id, str(parsed.original.get("model") or ""), parsed.original)
        # The error event continues the stream's sequence_number (the SDK checks the order).
        return _TranslatingStream(translator, lambda status, message: encode_sse(
            *translator.error_event(str(status), message)))

    def error(self, status: int, message: str, kind: str) -> Response:
        return json_response({"error": {"message": message, "type": kind, "param": None, "code": str(status)}},
                             status)

    def upstream_error(self, status: int, content: bytes) -> Response:
        return self.error(status, _engine_message(content), "server_error" if status >= 500 else "invalid_request_error")
