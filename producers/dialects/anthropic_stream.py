"""vLLM chat SSE chunks as Anthropic Messages SSE events, translated chunk by chunk (pure).

Event order (Anthropic's): ``message_start``, ``ping``, then per content block
``content_block_start`` / ``content_block_delta``* / ``content_block_stop``, then
``message_delta`` (stop reason, usage) and ``message_stop``.

Guarantees:

* ``feed`` returns the events a chunk makes possible right away (real pass-through); it
  never returns ``message_stop``. ``finish`` returns the rest (closing the open block,
  ``message_delta``) and, separately, the terminal ``message_stop``, which the interceptor
  sends only once the capture is durable.
* Blocks are sequential and numbered from 0: a delta of another kind (reasoning, text, a
  new tool call) closes the open block first. The first chunk's ``content: ""`` opens
  nothing, so a stream and the non-streaming response of the same generation have the same
  blocks (vLLM puts parsed content before tool calls in both).
* Tool arguments are passed through as ``input_json_delta`` fragments, verbatim; the client
  parses the concatenation (as with Anthropic's own streams).
* ``finish`` raises ``DialectError`` when no chunk carried a ``finish_reason``: an
  interrupted stream must not be closed as if it were complete.
* Token fields are read for counting at most, never emitted.
"""

from __future__ import annotations

from typing import Any

from producers.dialects.anthropic_output import stop_fields, usage
from producers.dialects.chat_chunks import ChatChunk, ChunkReader
from producers.dialects.common import DialectError

Event = tuple[str, dict]


class StreamTranslator:
    """One translator per streamed call: ``feed`` each parsed chunk, then ``finish`` once."""

    def __init__(self, response_id: str, model: str) -> None:
        self.response_id = response_id
        self.model = model
        self.reader = ChunkReader()
        self.started = False
        self.finished = False
        self.block_index = -1
        self.open_kind: Any = None  # "thinking" | "text" | ("tool", chat index) | None
        self.tool_blocks = 0

    def feed(self, chunk: dict, read: ChatChunk | None = None) -> list[Event]:
        """The events ``chunk`` makes possible now; ``read`` is ``read_chunk(chunk)`` if the caller made it."""
        if self.finished:
            raise DialectError("chunk fed after finish()")
        ops = self.reader.read(chunk, read)
        events: list[Event] = []
        if not self.started:
            events.extend(self._start())
        for op in ops:
            kind = op[0]
            if kind == "reasoning":
                events.extend(self._ensure("thinking", {"type": "thinking", "thinking": "", "signature": ""}))
                events.append(self._delta({"type": "thinking_delta", "thinking": op[1]}))
            elif kind == "text":
                events.extend(self._ensure("text", {"type": "text", "text": ""}))
                events.append(self._delta({"type": "text_delta", "text": op[1]}))
            elif kind == "tool":
                _, index, call_id, name = op
                self.tool_blocks += 1
                events.extend(self._ensure(("tool", index),
                                           {"type": "tool_use", "id": call_id, "name": name, "input": {}}))
            elif kind == "args":
                if self.open_kind != ("tool", op[1]):
                    raise DialectError(f"arguments for tool call {op[1]} arrived after its block closed")
                events.append(self._delta({"type": "input_json_delta", "partial_json": op[2]}))
        return events

    def finish(self) -> tuple[list[Event], Event]:
        """(closing block + ``message_delta``, terminal ``message_stop``)."""
        if self.finished:
            raise DialectError("finish() called twice")
        finish_reason = self.reader.require_finished()
        self.finished = True
        events: list[Event] = [] if self.started else self._start()
        events.extend(self._close())
        stop_reason, stop_sequence = stop_fields(finish_reason, self.reader.stop_reason, self.tool_blocks > 0)
        input_tokens, output_tokens = self.reader.usage()
        events.append(("message_delta", {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
            "usage": usage(input_tokens, output_tokens),
        }))
        return events, ("message_stop", {"type": "message_stop"})

    # -- pieces -------------------------------------------------------------------

    def _start(self) -> list[Event]:
        self.started = True
        input_tokens, _ = self.reader.usage()
        message: dict[str, Any] = {
            "id": self.response_id, "type": "message", "role": "assistant", "model": self.model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": usage(input_tokens, 0),
        }
        return [("message_start", {"type": "message_start", "message": message}), ("ping", {"type": "ping"})]

    def _ensure(self, kind: Any, block: dict) -> list[Event]:
        if self.open_kind == kind:
            return []
        events = self._close()
        self.block_index += 1
        self.open_kind = kind
        events.append(("content_block_start",
                       {"type": "content_block_start", "index": self.block_index, "content_block": block}))
        return events

    def _delta(self, delta: dict) -> Event:
        return ("content_block_delta", {"type": "content_block_delta", "index": self.block_index, "delta": delta})

    def _close(self) -> list[Event]:
        if self.open_kind is None:
            return []
        self.open_kind = None
        return [("content_block_stop", {"type": "content_block_stop", "index": self.block_index})]
