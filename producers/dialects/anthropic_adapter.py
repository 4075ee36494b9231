"""The Anthropic Messages adapter: the pure translator in ``anthropic`` served over HTTP.

The engine is always asked through chat completions (vLLM's own /v1/messages returns no
token ids). Guarantees: requests are checked (``anthropic.check_request``) before they are
translated; answers and stream events are the translator's, under the call's ``msg_tt``
response id; errors, the interceptor's and the engine's, have the shape the Anthropic SDK
reads (``{"type": "error", "error": {"type": ..., "message": ...}}``).
"""

from __future__ import annotations

from typing import Any

from starlette.responses import Response

from producers.dialects import anthropic
from producers.dialects.base import ParsedRequest, SpecAdapter, StreamAdapter, TranslatingStream
from producers.dialects.common import encode_sse
from producers.engine.info import engine_message
from producers.http.replies import event_json, json_response

__all__ = ["AnthropicAdapter"]

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                503: "overloaded_error", 529: "overloaded_error"}


def _error_body(status: int, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": _ERROR_TYPES.get(status, "api_error"), "message": message}}


class AnthropicAdapter(SpecAdapter):
    def parse(self, body: dict[str, Any], *, api_path: str = "", query: str = "") -> ParsedRequest:
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
        return TranslatingStream(
            translator, lambda status, message: encode_sse("error", _error_body(status, message), event_json), event_json)

    def error(self, status: int, message: str, kind: str) -> Response:
        return json_response(_error_body(status, message), status)

    def upstream_error(self, status: int, content: bytes) -> Response:
        return self.error(status, engine_message(content), "api_error")
