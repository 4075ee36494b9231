"""A recording OpenAI Responses API stub, enough for ``codex exec`` to run tool-using sessions.

``RecordingResponsesStub(responder)`` serves ``POST .../responses`` (any path prefix, so the
interceptor's ``/ng-rollout/<id>/training-token-capture/v1/responses`` works too) as the SSE stream
the CLI consumes (``response.created``, ``response.output_item.added``/``.done`` per item,
``response.completed`` with usage), or as JSON when ``stream`` is false, and records every request
with the answer it got. Every other path is a 404, recorded as well, so a test sees any request
the CLI should not have made. ``scripted([...])`` answers the n-th model turn with the n-th
``Reply``; ``exec_command_call`` and ``text_reply`` build the two kinds of turn.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

from compose.harnesses.stub_server import QuietHandler, ServedStub, parse_body


@dataclass
class Reply:
    output: list[dict[str, Any]]  # Responses output items
    status: int = 200
    error: dict[str, Any] | None = None  # with status >= 400: {"message": ..., "type": ...}


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    reply: Reply | None = None


def exec_command_call(cmd: str, call_id: str | None = None, **extra: Any) -> Reply:
    """One ``exec_command`` function call (Codex's default shell tool), ``{"cmd": cmd, **extra}``."""
    return function_call("exec_command", {"cmd": cmd, **extra}, call_id)


_CALL_IDS = itertools.count(1)


def function_call(name: str, arguments: dict[str, Any] | str, call_id: str | None = None) -> Reply:
    """One function call; ``arguments`` go out as given (a dict as ``json.dumps`` writes it)."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return Reply([{"type": "function_call", "name": name, "arguments": text,
                   "call_id": call_id or f"call_stub{next(_CALL_IDS):04d}"}])


def text_reply(text: str) -> Reply:
    return Reply([{"type": "message", "role": "assistant",
                   "content": [{"type": "output_text", "text": text, "annotations": []}]}])


def error_reply(status: int, message: str) -> Reply:
    return Reply([], status=status, error={"message": message, "type": "invalid_request_error"})


def scripted(replies: list[Reply], after: Reply | None = None) -> Callable[[dict[str, Any]], Reply]:
    """The n-th request gets ``replies[n]``; later ones ``after`` (default: a short text)."""
    lock = threading.Lock()
    counter = itertools.count()

    def respond(body: dict[str, Any]) -> Reply:
        with lock:
            n = next(counter)
        return replies[n] if n < len(replies) else (after or text_reply("done"))

    return respond


class RecordingResponsesStub(ServedStub):
    def __init__(self, responder: Callable[[dict[str, Any]], Reply] | None = None,
                 host: str = "127.0.0.1", port: int = 0) -> None:
        self.responder = responder or scripted([])
        self.requests: list[RecordedRequest] = []
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        stub = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                stub._record(self, None)
                self.send_json(404, {"error": {"message": f"no such path {self.path}", "type": "not_found"}})

            def do_POST(self) -> None:
                body = parse_body(self.read_body())
                request = stub._record(self, body)
                if not self.path.split("?")[0].endswith("/responses") or not isinstance(body, dict):
                    self.send_json(404, {"error": {"message": f"no such path {self.path}", "type": "not_found"}})
                    return
                reply = stub.responder(body)
                request.reply = reply
                if reply.status >= 400:
                    self.send_json(reply.status, {"error": reply.error or {"message": "error"}})
                    return
                response = stub._response(body, reply)
                try:
                    if body.get("stream"):
                        self._stream(response)
                    else:
                        self.send_json(200, response)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True  # the client is gone (a run killed at its timeout)

            def _stream(self, response: dict[str, Any]) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("cache-control", "no-cache")
                self.send_header("connection", "close")
                self.end_headers()
                seq = itertools.count()
                events: list[dict[str, Any]] = [
                    {"type": "response.created", "response": {**response, "status": "in_progress", "output": []}}]
                for index, item in enumerate(response["output"]):
                    events.append({"type": "response.output_item.added", "output_index": index,
                                   "item": {**item, "status": "in_progress"}})
                    events.append({"type": "response.output_item.done", "output_index": index, "item": item})
                events.append({"type": "response.completed", "response": response})
                for event in events:
                    event["sequence_number"] = next(seq)
                    self.wfile.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
                self.wfile.flush()
                self.close_connection = True

        self._bind(host, port, Handler, name="responses-stub")

    # -- lifecycle (``with``: compose.harnesses.stub_server) ------------------------------
    @property
    def base_url(self) -> str:
        """What the CLI gets as its provider's ``base_url``."""
        return f"{self.url}/v1"

    # -- use --------------------------------------------------------------------
    def responses_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.method == "POST" and r.path.split("?")[0].endswith("/responses")]

    def _record(self, handler: BaseHTTPRequestHandler, body: Any) -> RecordedRequest:
        request = RecordedRequest(handler.command, handler.path, {k.lower(): v for k, v in handler.headers.items()},
                                  body)
        with self._lock:
            self.requests.append(request)
        return request

    def _response(self, body: dict[str, Any], reply: Reply) -> dict[str, Any]:
        n = next(self._ids)
        output = []
        for i, item in enumerate(reply.output):
            item = dict(item)
            item.setdefault("id", f"{'fc' if item.get('type') == 'function_call' else 'msg'}_stub{n:04d}{i}")
            item.setdefault("status", "completed")
            output.append(item)
        prompt_chars = len(json.dumps(body.get("input")))
        usage: dict[str, Any] = {"input_tokens": prompt_chars // 4, "input_tokens_details": {"cached_tokens": 0},
                                 "output_tokens": 8 * max(1, len(output)),
                                 "output_tokens_details": {"reasoning_tokens": 0}}
        usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
        return {"id": f"resp_stub{n:04d}", "object": "response", "created_at": 0, "status": "completed",
                "model": body.get("model"), "output": output, "usage": usage}


__all__ = ["RecordedRequest", "RecordingResponsesStub", "Reply", "error_reply", "exec_command_call",
           "function_call", "scripted", "text_reply"]
