"""A toy dialect, to show (and test) that a dialect is its module plus one registration line.

Request ``{"model": str, "prompt": str, "stream"?: bool, "max_tokens"?: int}``; answer
``{"id": <response id>, "text": str, "finish": str}``; a stream is ``data: {"delta": text}``
events closed by ``data: {"id", "finish", "done": true}``; errors ``{"toy_error": {"status",
"message"}}``. It serves ``/v1/toy/generate`` under the capture prefix with ids ``toy-tt<call id>``.

Its wire symbol is ``Dialect.UNKNOWN``, an existing ``CallFacts.dialect`` symbol (the enum's
Avro default). A real new dialect adds its own symbol, and that is a contract change
(``CallFacts.avsc``, its schema history and ``schemas.records.Dialect`` move together); a toy
that lives in the tests must not change the wire contract, and UNKNOWN is the symbol that
honestly says "a dialect this schema does not name". Its stream is read by the same
``ChunkReader`` the Anthropic and Responses translators use.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

from producers.dialects.base import ParsedRequest, SpecAdapter, StreamAdapter
from producers.dialects.chat_chunks import ChunkReader
from producers.dialects.common import DialectError, expect
from producers.dialects.registry import DialectSpec
from producers.http.replies import json_response
from schemas.records import Dialect

__all__ = ["TOY", "ToyAdapter"]

TOY = DialectSpec("toy", "/v1/toy/generate", Dialect.UNKNOWN, "toy-",
                  "tests.unit.producers.toy_dialect:ToyAdapter", stream_usage=False)


def _event(data: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


class ToyAdapter(SpecAdapter):
    def parse(self, body: dict[str, Any], *, api_path: str = "", query: str = "") -> ParsedRequest:
        prompt = expect(body.get("prompt"), "string", "prompt", "the text to complete")
        messages = [{"role": "user", "content": prompt}]
        chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
        if body.get("max_tokens") is not None:
            chat["max_tokens"] = expect(body["max_tokens"], "integer", "max_tokens")
        return ParsedRequest(chat_body=chat, items=messages, stream=bool(body.get("stream")), original=body)

    def render(self, data: dict[str, Any], response_id: str, parsed: ParsedRequest) -> Response:
        choice = (data.get("choices") or [{}])[0]
        text = (choice.get("message") or {}).get("content")
        if not isinstance(text, str):
            raise DialectError("the toy dialect answers text only")
        return json_response({"id": response_id, "text": text, "finish": choice.get("finish_reason")})

    def stream_adapter(self, response_id: str, parsed: ParsedRequest) -> StreamAdapter:
        return ToyStream(response_id)

    def error(self, status: int, message: str, kind: str) -> Response:
        return json_response({"toy_error": {"status": status, "message": message}}, status)

    def upstream_error(self, status: int, content: bytes) -> Response:
        return self.error(status, content.decode(errors="replace"), "upstream_error")


class ToyStream:
    def __init__(self, response_id: str) -> None:
        self.response_id = response_id
        self.reader = ChunkReader()

    def feed(self, chunk: dict[str, Any], read: Any = None) -> bytes:
        return b"".join(_event({"delta": op[1]}) for op in self.reader.read(chunk, read) if op[0] == "text")

    def finish(self) -> tuple[bytes, bytes]:
        return b"", _event({"id": self.response_id, "finish": self.reader.require_finished(), "done": True})

    def error(self, status: int, message: str, kind: str = "capture_error") -> bytes:
        return _event({"toy_error": {"status": status, "message": message}})
