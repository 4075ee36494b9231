"""The adapter contract: what a dialect gives the capture core, and what the core gives back.

A dialect adapter (``DialectAdapter``) is built once at startup as ``Class(spec)`` from its
``producers.dialects.registry.DialectSpec``. It parses the harness's request into chat terms
(``ParsedRequest``) plus the items lineage hashes, renders the engine's answer back, translates
a stream chunk by chunk (``StreamAdapter``: only the terminal event waits until the capture is
durable), and shapes errors the way the dialect's SDK reads them.

Guarantees asked of an adapter: ``parse`` raises ``ValueError`` (usually ``DialectError``)
naming the field for a request it cannot serve, before anything reaches the engine; ``render``
raises ``ValueError`` when the engine's answer cannot be expressed (the core records that
before any capture is written); nothing it returns carries a token field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # the contract is typed against starlette; importing it needs no framework
    from starlette.responses import Response

    from producers.dialects.registry import DialectSpec

from producers.dialects.chat_chunks import ChatChunk
from producers.dialects.common import compact_json, encode_sse

__all__ = ["DialectAdapter", "ParsedRequest", "SpecAdapter", "StreamAdapter", "TranslatingStream"]


@dataclass(slots=True)
class ParsedRequest:
    """A harness request in chat-completions terms, plus what lineage hashes."""

    chat_body: dict[str, Any]
    items: list[dict[str, Any]]
    instructions: Any = None
    tools: Any = None
    system: Any = None
    stream: bool = False
    keep_logprobs: bool = False
    original: dict[str, Any] = field(default_factory=dict)  # the harness's own request body
    # Request fields ``CallFacts`` reads (model, max_output_tokens) that this dialect's body does not carry at
    # the top level (Gemini: the model is in the path, the budget in generationConfig).
    facts: dict[str, Any] = field(default_factory=dict)


class StreamAdapter(Protocol):
    def feed(self, chunk: dict[str, Any], read: ChatChunk) -> bytes:
        """Bytes to send now for one engine chunk (may be empty). The chunk is the adapter's from here on:
        it may consume it (the chat adapter strips the token fields in place); the caller reads it no more.
        ``read`` is ``chat_chunks.read_chunk(chunk)``, already made by the capture: a translator reads the
        chunk through it (``ChunkReader.read(chunk, read)``) instead of reading it a second time."""

    def finish(self) -> tuple[bytes, bytes]:
        """(the last non-terminal bytes, the terminal event) once the capture is durable."""

    def error(self, status: int, message: str, kind: str = "capture_error") -> bytes:
        """An error event that ends the stream instead of the terminal event."""


class DialectAdapter(Protocol):
    """One dialect's adapter; its methods are ``registry.ADAPTER_METHODS`` (checked at startup)."""

    spec: DialectSpec

    def parse(self, body: dict[str, Any], *, api_path: str = "", query: str = "") -> ParsedRequest:
        """Raise ValueError with a message naming the field for a request this dialect cannot serve.

        ``api_path`` (after the prefix) and ``query`` are the call's: a dialect whose path says part of
        the request (Gemini's model, and whether it streams: ``registry.DialectSpec.match``) reads them."""

    def render(self, data: dict[str, Any], response_id: str, parsed: ParsedRequest) -> Response:
        """The harness's answer; ValueError (DialectError) when the engine's answer cannot be expressed."""

    def stream_adapter(self, response_id: str, parsed: ParsedRequest) -> StreamAdapter:
        """The translator of one call's engine stream, under the call's response id."""

    def error(self, status: int, message: str, kind: str) -> Response:
        """An error the interceptor itself answers, in the dialect's shape."""

    def upstream_error(self, status: int, content: bytes) -> Response:
        """The engine's error answer (``content`` as it sent it), in the dialect's shape."""


class SpecAdapter:
    """Base of the built-in adapters: built as ``Class(spec)``, it keeps its spec."""

    def __init__(self, spec: DialectSpec) -> None:
        self.spec = spec


class TranslatingStream:
    """A ``StreamAdapter`` over a pure translator's ``(event, data)`` lists: encodes them as SSE.

    ``dumps`` encodes one event's data as compact UTF-8 JSON (``common.compact_json``'s bytes; the
    adapters pass a faster encoder of the same bytes, which this pure module may not import).
    ``encode`` frames one event (``common.encode_sse``: ``event:`` and ``data:`` lines; a dialect
    whose events have no name passes ``common.encode_sse_data``).
    """

    def __init__(self, translator: Any, error_event: Any, dumps: Any = compact_json, encode: Any = encode_sse) -> None:
        self._t = translator
        self._error_event = error_event  # (status, message) -> bytes, in the dialect's shape
        self._dumps = dumps
        self._encode = encode

    def feed(self, chunk: dict[str, Any], read: ChatChunk | None = None) -> bytes:
        dumps, encode = self._dumps, self._encode
        return b"".join(encode(name, data, dumps) for name, data in self._t.feed(chunk, read))

    def finish(self) -> tuple[bytes, bytes]:
        rest, (name, data) = self._t.finish()
        dumps, encode = self._dumps, self._encode
        return b"".join(encode(n, d, dumps) for n, d in rest), encode(name, data, dumps)

    def error(self, status: int, message: str, kind: str = "capture_error") -> bytes:
        return self._error_event(status, message)
