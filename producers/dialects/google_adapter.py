"""The Google Gemini adapter: the pure translator in ``google`` served over HTTP.

The engine is always asked through chat completions. The model and whether the call streams
come from the path (``registry.DialectSpec.match``: ``:generateContent`` answers JSON,
``:streamGenerateContent?alt=sse`` server-sent events); the request is checked and translated by
``google.to_chat_request`` (DialectError naming the field). Answers and stream chunks are the
translator's, under the call's ``gen_tt`` response id (``responseId``); errors, the interceptor's
and the engine's, streamed or not, have Google's shape
(``{"error": {"code", "message", "status"}}``), which the Google SDKs and the Gemini CLI read.

``:countTokens`` (route policy ``count``, ``producers.call.count``): ``count_request`` is the chat
request the same contents would send (so the count is the engine's rendering of the prompt,
system instruction and tools included), ``count_response`` answers ``{"totalTokens": n}``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from starlette.responses import Response

from producers.dialects import google
from producers.dialects.base import ParsedRequest, SpecAdapter, StreamAdapter, TranslatingStream
from producers.dialects.common import DialectError, encode_sse_data
from producers.dialects.google_config import generation_settings
from producers.dialects.google_stream import error_body
from producers.dialects.registry import PathMatch
from producers.engine.info import engine_message
from producers.http.replies import event_json, json_response

__all__ = ["GoogleAdapter"]


class GoogleAdapter(SpecAdapter):
    def _match(self, api_path: str) -> PathMatch:
        found = self.spec.match(api_path)
        if found is None or found.model is None:
            raise DialectError(f"{api_path!r} is not a path of the {self.spec.name} dialect "
                               f"(expected {', '.join(self.spec.paths())})")
        return found

    def parse(self, body: dict[str, Any], *, api_path: str = "", query: str = "") -> ParsedRequest:
        found = self._match(api_path)
        alt = parse_qs(query, keep_blank_values=True).get("alt", [None])[-1]
        stream = google.request_settings(alt, found.stream)
        body = google.normalize(body)  # one spelling of each field (the translator's functions accept both)
        chat = google.to_chat_request(body, model=found.model, stream=stream)
        items, instructions, tools = google.hash_items(body)
        # The facts' model is the one the path names (the body has none); their budget is maxOutputTokens.
        facts: dict[str, Any] = {"model": found.model, "max_output_tokens": chat.get("max_tokens")}
        return ParsedRequest(chat_body=chat, items=items, instructions=instructions, tools=tools,
                             system=body.get("systemInstruction"), stream=stream, original=body, facts=facts)

    def render(self, data: dict[str, Any], response_id: str, parsed: ParsedRequest) -> Response:
        # DialectError propagates: the core records it before any capture is written.
        return json_response(google.from_chat_response(data, response_id=response_id, model=_model(parsed),
                                                       thoughts=_thoughts(parsed)))

    def stream_adapter(self, response_id: str, parsed: ParsedRequest) -> StreamAdapter:
        translator = google.StreamTranslator(response_id, _model(parsed), thoughts=_thoughts(parsed))
        return TranslatingStream(
            translator, lambda status, message: encode_sse_data("", error_body(status, message), event_json),
            event_json, encode_sse_data)

    def error(self, status: int, message: str, kind: str) -> Response:
        return json_response(error_body(status, message), status)

    def upstream_error(self, status: int, content: bytes) -> Response:
        return self.error(status, engine_message(content), "api_error")

    # -- :countTokens (producers.call.count) -------------------------------------------
    def count_request(self, body: dict[str, Any], *, api_path: str = "") -> dict[str, Any]:
        return google.count_chat_request(body, model=self._match(api_path).model)

    def count_response(self, count: int) -> Response:
        return json_response({"totalTokens": count})


def _model(parsed: ParsedRequest) -> str:
    return str(parsed.facts.get("model") or "")


def _thoughts(parsed: ParsedRequest) -> bool:
    """Whether the request's thinkingConfig.includeThoughts asked for thought parts (parse checked it)."""
    return generation_settings(parsed.original.get("generationConfig"))[1]
