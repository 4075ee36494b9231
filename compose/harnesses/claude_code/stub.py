"""A recording Anthropic Messages stub the CLI can finish multi-turn tool-using sessions against."""

from __future__ import annotations

import copy
import json
import threading
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any

from compose.harnesses.stub_server import QuietHandler, RecordedRequest, ServedStub, record_of

# A RecordedRequest's ``response`` here: the JSON the stub answered with (for SSE: the message the
# events spell out).


Reply = dict[str, Any]
"""``{"content": [blocks], "stop_reason": str}``, or ``{"status": int, "error": {"type", "message"}}``
for an Anthropic error response. Blocks may be ``text``, ``tool_use`` or ``thinking`` (with
``signature``)."""
Responder = Callable[[dict[str, Any]], Reply]


def _tool_names(body: dict[str, Any]) -> set[str | None]:
    return {t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)}


def _assistant_turns(body: dict[str, Any]) -> int:
    return sum(1 for m in body.get("messages") or [] if m.get("role") == "assistant")


def scripted(replies: list[Reply], *, side_text: str = "tokentrail") -> Responder:
    """A deterministic model: the n-th reply for a request whose history holds n-1 assistant turns.

    Keyed on the conversation, not on a call counter, so a retried request gets the same reply.
    ``tool_use`` blocks without an ``id`` get ``toolu_tokentrail_<turn><block>``. Requests that
    offer no ``Bash`` tool (side calls, if the CLI ever makes them) get ``side_text``.
    """

    def respond(body: dict[str, Any]) -> Reply:
        if "Bash" not in _tool_names(body):
            return {"content": [{"type": "text", "text": side_text}], "stop_reason": "end_turn"}
        turn = _assistant_turns(body)
        reply = copy.deepcopy(replies[min(turn, len(replies) - 1)])
        for i, block in enumerate(reply.get("content") or []):
            if block.get("type") == "tool_use" and "id" not in block:
                block["id"] = f"toolu_tokentrail_{turn + 1:02d}{i:02d}"
        return reply

    return respond


def bash_tool_use(command: str, description: str = "Print tokentrail", *, first: str = "command",
                  pre: list[dict[str, Any]] | None = None) -> Reply:
    """A reply that calls the ``Bash`` tool; ``first="description"`` puts that key first in ``input``."""
    inp = {"command": command, "description": description}
    if first == "description":
        inp = {"description": description, "command": command}
    return {"content": [*(pre or []), {"type": "tool_use", "name": "Bash", "input": inp}],
            "stop_reason": "tool_use"}


def text_reply(text: str, *, pre: list[dict[str, Any]] | None = None) -> Reply:
    return {"content": [*(pre or []), {"type": "text", "text": text}], "stop_reason": "end_turn"}


def bash_then_text(command: str = "echo tokentrail", final: str = "Done: the command printed tokentrail.",
                   side_text: str = "tokentrail") -> Responder:
    """The two-turn script: ``Bash(command)`` first, ``final`` once the tool_result came back."""
    return scripted([bash_tool_use(command), text_reply(final)], side_text=side_text)


def _request_id() -> str:
    return f"req_{uuid.uuid4().hex[:24]}"


class RecordingAnthropicStub(ServedStub):
    """An Anthropic Messages API stand-in on 127.0.0.1 that records every request.

    Answers ``POST /v1/messages`` (SSE when ``stream`` is true, JSON otherwise) from a
    ``Responder``, ``POST /v1/messages/count_tokens`` with a character-based estimate,
    ``GET /v1/models[/id]`` with the requested model; anything else gets an Anthropic-style 404
    (and is recorded). Use as a context manager; ``base_url`` has no trailing ``/v1``.
    """

    def __init__(self, responder: Responder | None = None, *, host: str = "127.0.0.1", port: int = 0):
        self.responder = responder or bash_then_text()
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        stub = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                stub._handle(self)

            def do_POST(self) -> None:
                stub._handle(self)

            def do_HEAD(self) -> None:
                stub._handle(self)

            def do_PUT(self) -> None:
                stub._handle(self)

            def do_DELETE(self) -> None:
                stub._handle(self)

        self._bind(host, port, Handler, name="anthropic-stub")

    @property
    def base_url(self) -> str:
        return self.url

    def messages_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.method == "POST" and r.path.rstrip("/").endswith("/v1/messages")]

    # -- request handling

    def _handle(self, h: QuietHandler) -> None:
        record = record_of(h, h.read_body(), RecordedRequest, keep_blank_values=True)
        with self._lock:
            self.requests.append(record)
        status, payload, sse = self._answer(h.command, record.path.rstrip("/"), record.path, record.body, record.raw)
        record.status, record.response = status, payload
        try:
            if sse:
                self._sse(h, payload)
            else:
                h.send_json(status, payload, headers={"request-id": _request_id()})
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (e.g. killed)
            h.close_connection = True

    def _answer(self, method: str, path: str, full_path: str, body: Any, raw: bytes) -> tuple[int, Any, bool]:
        if method == "POST" and path.endswith("/v1/messages/count_tokens"):
            return 200, {"input_tokens": max(1, len(raw) // 4)}, False
        if method == "POST" and path.endswith("/v1/messages") and isinstance(body, dict):
            reply = self.responder(copy.deepcopy(body))
            if "status" in reply:
                return reply["status"], {"type": "error", "error": reply["error"]}, False
            message = self._message(body, reply)
            return 200, message, bool(body.get("stream"))
        if method == "GET" and "/v1/models" in path:
            model_id = path.split("/v1/models", 1)[1].strip("/") or "claude-stub"
            entry = {"type": "model", "id": model_id, "display_name": model_id,
                     "created_at": "2025-01-01T00:00:00Z"}
            if path.endswith("/v1/models"):
                return 200, {"data": [entry], "has_more": False, "first_id": model_id, "last_id": model_id}, False
            return 200, entry, False
        if method == "HEAD":
            return 200, {}, False
        return 404, {"type": "error", "error": {"type": "not_found_error",
                                                "message": f"stub: no {method} {full_path}"}}, False

    @staticmethod
    def _message(body: dict[str, Any], reply: Reply) -> dict[str, Any]:
        prompt_chars = len(json.dumps(body.get("messages", []))) + len(json.dumps(body.get("system", "")))
        return {
            "id": f"msg_tokentrail_{_assistant_turns(body) + 1:02d}", "type": "message", "role": "assistant",
            "model": body.get("model", "claude-stub"), "content": reply["content"],
            "stop_reason": reply.get("stop_reason", "end_turn"), "stop_sequence": None,
            "usage": {"input_tokens": max(1, prompt_chars // 4), "output_tokens": 8,
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
        }

    @staticmethod
    def _sse(h: BaseHTTPRequestHandler, message: dict[str, Any]) -> None:
        events: list[tuple[str, dict[str, Any]]] = []
        start = {**message, "content": [], "stop_reason": None,
                 "usage": {**message["usage"], "output_tokens": 1}}
        events.append(("message_start", {"type": "message_start", "message": start}))
        for i, block in enumerate(message["content"]):
            if block["type"] == "text":
                events.append(("content_block_start", {"type": "content_block_start", "index": i,
                                                       "content_block": {"type": "text", "text": ""}}))
                events.append(("content_block_delta", {"type": "content_block_delta", "index": i,
                                                       "delta": {"type": "text_delta", "text": block["text"]}}))
            elif block["type"] == "tool_use":
                events.append(("content_block_start", {"type": "content_block_start", "index": i,
                                                       "content_block": {**block, "input": {}}}))
                events.append(("content_block_delta", {"type": "content_block_delta", "index": i,
                                                       "delta": {"type": "input_json_delta",
                                                                 "partial_json": json.dumps(block["input"])}}))
            elif block["type"] == "thinking":
                events.append(("content_block_start", {"type": "content_block_start", "index": i,
                                                       "content_block": {"type": "thinking", "thinking": "",
                                                                         "signature": ""}}))
                events.append(("content_block_delta", {"type": "content_block_delta", "index": i,
                                                       "delta": {"type": "thinking_delta",
                                                                 "thinking": block["thinking"]}}))
                events.append(("content_block_delta", {"type": "content_block_delta", "index": i,
                                                       "delta": {"type": "signature_delta",
                                                                 "signature": block["signature"]}}))
            else:
                raise ValueError(f"stub cannot stream a {block['type']!r} block")
            events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
        events.append(("message_delta", {"type": "message_delta",
                                         "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                                         "usage": {"output_tokens": message["usage"]["output_tokens"]}}))
        events.append(("message_stop", {"type": "message_stop"}))
        data = "".join(f"event: {name}\ndata: {json.dumps(payload)}\n\n" for name, payload in events).encode()
        h.send_response(200)
        h.send_header("content-type", "text/event-stream")
        h.send_header("cache-control", "no-cache")
        h.send_header("request-id", _request_id())
        h.send_header("content-length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)


# --------------------------------------------------------------------------- fixtures

