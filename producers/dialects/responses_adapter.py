"""The OpenAI Responses adapter: the pure translator in ``responses`` served over HTTP.

The engine is always asked through chat completions. Guarantees: requests are checked and
translated by ``responses.to_chat_request`` (DialectError naming the field); answers and
stream events are the translator's, under the call's ``resp_tt`` response id (a stream's
error event continues its ``sequence_number``, which the SDK checks); errors have the shape
the OpenAI SDK reads (``{"error": {"message", "type", "param", "code"}}``).
"""

from __future__ import annotations

from typing import Any

from starlette.responses import Response

from producers.dialects import responses
from producers.dialects.base import ParsedRequest, SpecAdapter, StreamAdapter, TranslatingStream
from producers.dialects.common import encode_sse
from producers.engine.info import engine_message
from producers.http.replies import event_json, json_response

__all__ = ["ResponsesAdapter"]


class ResponsesAdapter(SpecAdapter):
    def parse(self, body: dict[str, Any], *, api_path: str = "", query: str = "") -> ParsedRequest:
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
        return TranslatingStream(translator, lambda status, message: encode_sse(
            *translator.error_event(str(status), message), event_json), event_json)

    def error(self, status: int, message: str, kind: str) -> Response:
        return json_response({"error": {"message": message, "type": kind, "param": None, "code": str(status)}},
                             status)

    def upstream_error(self, status: int, content: bytes) -> Response:
        return self.error(status, engine_message(content), "server_error" if status >= 500 else "invalid_request_error")
