"""vLLM chat SSE chunks as Gemini ``streamGenerateContent`` chunks, translated chunk by chunk (pure).

A Gemini stream is a sequence of ``GenerateContentResponse`` objects (``data: {...}`` SSE events,
no event names), each with the parts generated since the previous one; the last carries
``finishReason`` and ``usageMetadata``.

Guarantees:

* ``feed`` returns the chunks an engine chunk makes possible right away (real pass-through): text
  as ``{"text": delta}`` parts, reasoning as ``{"text": delta, "thought": true}`` parts (only when
  the request asked for thoughts). It never returns the terminal chunk. ``finish`` returns the
  rest and, separately, the terminal chunk (``finishReason``, ``usageMetadata``, empty ``parts``),
  which the interceptor sends only once the capture is durable.
* Gemini streams whole ``functionCall`` parts, not argument deltas: a tool call is held until its
  arguments are complete (the next tool call starts, text follows, or the engine's chunk with the
  finish reason arrives) and is then sent as one ``functionCall`` part with the chat call's id;
  arguments that are not a JSON object raise ``DialectError`` (empty arguments are ``{}``).
* Every chunk carries ``responseId`` (the call's response id) and ``modelVersion``; the parts of
  the chunks concatenate to the non-streaming answer's (``google_output``).
* ``finish`` raises ``DialectError`` when no chunk carried a ``finish_reason``: an interrupted stream
  must not be closed as if it were complete. Token fields are read for counting at most, never emitted.
"""

from __future__ import annotations

from typing import Any

from producers.dialects.chat_chunks import ChatChunk, ChunkReader, read_chunk
from producers.dialects.common import DialectError
from producers.dialects.google_output import finish_reason, function_call, reasoning_tokens, usage_metadata

__all__ = ["EVENT", "StreamTranslator"]

EVENT = "message"  # Gemini's SSE events have no name; the adapter writes data lines only
Event = tuple[str, dict]


class StreamTranslator:
    """One translator per streamed call: ``feed`` each parsed chunk, then ``finish`` once."""

    def __init__(self, response_id: str, model: str, thoughts: bool = False) -> None:
        self.response_id = response_id
        self.model = model
        self.thoughts = thoughts
        self.reader = ChunkReader()
        self.finished = False
        self.call: tuple[int, str, str, list[str]] | None = None  # (chat index, id, name, argument fragments)
        self.thought_tokens: int | None = None

    def feed(self, chunk: dict, read: ChatChunk | None = None) -> list[Event]:
        """The chunks ``chunk`` makes possible now; ``read`` is ``read_chunk(chunk)`` if the caller made it."""
        if self.finished:
            raise DialectError("chunk fed after finish()")
        read = read_chunk(chunk) if read is None else read
        ops = self.reader.read(chunk, read)
        if read.usage is not None and reasoning_tokens(read.usage) is not None:
            self.thought_tokens = reasoning_tokens(read.usage)
        parts: list[dict] = []
        for op in ops:
            kind = op[0]
            if kind == "reasoning":
                if self.thoughts:
                    parts.append({"text": op[1], "thought": True})
            elif kind == "text":
                parts.extend(self._flush())
                parts.append({"text": op[1]})
            elif kind == "tool":
                parts.extend(self._flush())
                self.call = (op[1], op[2], op[3], [])
            elif kind == "args":
                if self.call is None or self.call[0] != op[1]:
                    raise DialectError(f"arguments for tool call {op[1]} arrived after its part was sent")
                self.call[3].append(op[2])
        if self.reader.finish_reason is not None:  # the generation is over: the last call is complete
            parts.extend(self._flush())
        return [self._chunk(parts)] if parts else []

    def finish(self) -> tuple[list[Event], Event]:
        """(the last held function call, if any; the terminal chunk with ``finishReason`` and usage)."""
        if self.finished:
            raise DialectError("finish() called twice")
        reason = self.reader.require_finished()
        self.finished = True
        parts = self._flush()
        rest = [self._chunk(parts)] if parts else []
        prompt, completion = self.reader.usage()
        terminal = self._chunk([], finishReason=finish_reason(reason))
        terminal[1]["usageMetadata"] = usage_metadata(prompt, completion, self.thought_tokens)
        return rest, terminal

    def error_event(self, status: int, message: str) -> Event:
        """A Google error object as a stream chunk (what Google's streams end with on failure)."""
        return EVENT, error_body(status, message)

    # -- pieces -------------------------------------------------------------------

    def _flush(self) -> list[dict]:
        if self.call is None:
            return []
        _, call_id, name, fragments = self.call
        self.call = None
        return [function_call(call_id, name, "".join(fragments) or "{}")]

    def _chunk(self, parts: list[dict], **candidate: Any) -> Event:
        return EVENT, {"candidates": [{"content": {"role": "model", "parts": parts}, **candidate, "index": 0}],
                       "modelVersion": self.model, "responseId": self.response_id}


# Google's canonical codes (google.rpc.Code) by HTTP status, as its REST errors name them.
_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
           405: "UNIMPLEMENTED", 409: "ABORTED", 413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED",
           499: "CANCELLED", 500: "INTERNAL", 501: "UNIMPLEMENTED", 502: "UNAVAILABLE", 503: "UNAVAILABLE",
           504: "DEADLINE_EXCEEDED"}


def error_body(status: int, message: str) -> dict:
    """Google's error shape: ``{"error": {"code", "message", "status"}}``."""
    return {"error": {"code": status, "message": message,
                      "status": _STATUS.get(status, "INTERNAL" if status >= 500 else "FAILED_PRECONDITION")}}
