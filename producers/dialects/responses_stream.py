"""vLLM chat SSE chunks as OpenAI Responses SSE events, translated chunk by chunk (pure).

Event order (the OpenAI API's): ``response.created``, ``response.in_progress``, then per
output item ``response.output_item.added``, its content events, ``response.output_item.done``:

* reasoning: ``content_part.added`` (``reasoning_text``), ``reasoning_text.delta``*,
  ``reasoning_text.done``, ``content_part.done``;
* message: ``content_part.added`` (``output_text``), ``output_text.delta``*,
  ``output_text.done``, ``content_part.done``;
* function call: ``function_call_arguments.delta``*, ``function_call_arguments.done``;

and finally ``response.completed`` (or ``response.incomplete`` when the generation hit
``max_output_tokens`` or a content filter, as the OpenAI API does; the SDK's
``get_final_response`` needs ``response.completed``, so clients see the same outcome as
against OpenAI).

Guarantees:

* Every event carries ``type`` and a ``sequence_number`` counting from 0, the terminal one
  included. An ``error`` event that ends the stream instead (``error_event``) continues the
  numbering of the events the client got: those of every ``feed`` that returned, not those
  of a ``finish`` whose events were never sent.
* ``feed`` never returns the terminal event; ``finish`` returns the closing
  events and, separately, the terminal event, which the interceptor sends only once the
  capture is durable. Its ``response`` is the full Response (``responses_output``) whose
  output items equal the ``output_item.done`` items, with the same deterministic ids a
  non-streaming call of the same generation gets.
* Items are sequential: a delta of another kind closes the open item first. The first
  chunk's ``content: ""`` opens nothing.
* ``finish`` raises ``DialectError`` when no chunk carried a ``finish_reason``.
* Token fields are read for counting at most, never emitted.
* A function call of a namespaced tool carries ``namespace`` in ``output_item.added`` and
  ``output_item.done`` alike (the harness may dispatch on either).
"""

from __future__ import annotations

import copy
from typing import Any

from producers.dialects.chat_chunks import ChatChunk, ChunkReader
from producers.dialects.common import DialectError
from producers.dialects.responses_output import (
    function_call_item,
    item_id,
    message_item,
    namespace_map,
    reasoning_item,
    response_object,
    status_of,
    usage,
)

Event = tuple[str, dict]


class StreamTranslator:
    """One translator per streamed call: ``feed`` each parsed chunk, then ``finish`` once."""

    def __init__(self, response_id: str, model: str, request: dict) -> None:
        self.response_id, self.model, self.request = response_id, model, request
        self.namespaces = namespace_map(request.get("tools"))  # a namespaced call's item carries its namespace
        self.reader = ChunkReader()
        self.sequence = 0
        self.sent = 0  # events handed out by feed calls that returned (the client has them)
        self.started = False
        self.finished = False
        self.output: list[dict] = []  # done items
        self.open: dict[str, Any] | None = None  # {"kind", "index", "id", "text", ...}

    def feed(self, chunk: dict, read: ChatChunk | None = None) -> list[Event]:
        """The events ``chunk`` makes possible now; ``read`` is ``read_chunk(chunk)`` if the caller made it."""
        if self.finished:
            raise DialectError("chunk fed after finish()")
        ops = self.reader.read(chunk, read)
        events: list[Event] = [] if self.started else self._start()
        for op in ops:
            kind = op[0]
            if kind == "reasoning":
                events.extend(self._ensure("reasoning"))
                events.append(self._content_delta("response.reasoning_text.delta", op[1]))
            elif kind == "text":
                events.extend(self._ensure("message"))
                events.append(self._content_delta("response.output_text.delta", op[1], logprobs=[]))
            elif kind == "tool":
                events.extend(self._ensure("function_call", tool=op[1:]))
            elif kind == "args":
                if self.open is None or self.open.get("tool") != op[1]:
                    raise DialectError(f"arguments for tool call {op[1]} arrived after its item closed")
                self.open["text"] += op[2]
                events.append(self._event("response.function_call_arguments.delta", item_id=self.open["id"],
                                          output_index=self.open["index"], delta=op[2]))
        self.sent = self.sequence
        return events

    def error_event(self, code: str, message: str) -> Event:
        """The ``error`` event that ends the stream instead of the terminal one, numbered after what was sent."""
        self.finished = True
        self.sequence = self.sent
        event = self._event("error", code=code, message=message, param=None)
        self.sent = self.sequence
        return event

    def finish(self) -> tuple[list[Event], Event]:
        """(closing events, terminal ``response.completed`` / ``response.incomplete``)."""
        if self.finished:
            raise DialectError("finish() called twice")
        status, reason = status_of(self.reader.require_finished())
        self.finished = True
        events: list[Event] = [] if self.started else self._start()
        events.extend(self._close(incomplete=status == "incomplete"))
        response = self._response(status, reason)
        response["usage"] = usage(*self.reader.usage())
        terminal = self._event(f"response.{status}", response=response)
        return events, terminal

    # -- pieces -------------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> Event:
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return kind, data

    def _response(self, status: str, reason: str | None = None) -> dict:
        return response_object(self.request, response_id=self.response_id, model=self.model,
                               created_at=self.reader.created, status=status, incomplete_reason=reason,
                               output=copy.deepcopy(self.output))

    def _start(self) -> list[Event]:
        self.started = True
        return [self._event("response.created", response=self._response("in_progress")),
                self._event("response.in_progress", response=self._response("in_progress"))]

    def _ensure(self, kind: str, tool: tuple | None = None) -> list[Event]:
        if self.open is not None and self.open["kind"] == kind and tool is None:
            return []
        events = self._close()
        index = len(self.output)
        open_: dict[str, Any] = {"kind": kind, "index": index, "id": item_id(kind, self.response_id, index), "text": ""}
        if kind == "reasoning":
            item = {"type": "reasoning", "id": open_["id"], "summary": [], "content": []}
            part: dict | None = {"type": "reasoning_text", "text": ""}
        elif kind == "message":
            item = message_item(open_["id"], None, status="in_progress")
            part = {"type": "output_text", "text": "", "annotations": []}
        else:
            assert tool is not None  # a function call opens with its (tool, call id, name)
            open_["tool"], open_["call_id"], open_["name"] = tool
            item = function_call_item(open_["id"], open_["call_id"], open_["name"], "", status="in_progress",
                                      namespace=self.namespaces.get(open_["name"]))
            part = None
        self.open = open_
        events.append(self._event("response.output_item.added", output_index=index, item=item))
        if part is not None:
            events.append(self._event("response.content_part.added", item_id=open_["id"], output_index=index,
                                      content_index=0, part=part))
        return events

    def _content_delta(self, kind: str, text: str, **extra: Any) -> Event:
        assert self.open is not None
        self.open["text"] += text
        return self._event(kind, item_id=self.open["id"], output_index=self.open["index"], content_index=0,
                           delta=text, **extra)

    def _close(self, incomplete: bool = False) -> list[Event]:
        open_, self.open = self.open, None
        if open_ is None:
            return []
        kind, index, iid, text = open_["kind"], open_["index"], open_["id"], open_["text"]
        status = "incomplete" if incomplete else "completed"
        where = {"item_id": iid, "output_index": index}
        events: list[Event] = []
        if kind == "reasoning":
            item = reasoning_item(iid, text)
            events.append(self._event("response.reasoning_text.done", **where, content_index=0, text=text))
            events.append(self._event("response.content_part.done", **where, content_index=0,
                                      part={"type": "reasoning_text", "text": text}))
        elif kind == "message":
            item = message_item(iid, text, status=status)
            events.append(self._event("response.output_text.done", **where, content_index=0, text=text, logprobs=[]))
            events.append(self._event("response.content_part.done", **where, content_index=0,
                                      part=dict(item["content"][0])))
        else:
            item = function_call_item(iid, open_["call_id"], open_["name"], text, status=status,
                                      namespace=self.namespaces.get(open_["name"]))
            events.append(self._event("response.function_call_arguments.done", **where,
                                      name=open_["name"], arguments=text))
        self.output.append(item)
        events.append(self._event("response.output_item.done", output_index=index, item=copy.deepcopy(item)))
        return events
