"""A recording Gemini API stub (``generativelanguage`` v1beta shape) the CLI can finish multi-turn
tool-using sessions against.

``RecordingGeminiStub(responder)`` serves, under any path prefix (so the interceptor's
``/ng-rollout/<id>/training-token-capture`` works too):

* ``POST .../models/<model>:streamGenerateContent?alt=sse``: the reply as SSE, one
  ``data: <GenerateContentResponse>`` event per chunk, the last one with ``finishReason`` and
  ``usageMetadata`` (the CLI retries a stream that ends without a finish reason);
* ``POST .../models/<model>:generateContent``: the chunks' parts in one JSON response;
* ``POST .../models/<model>:countTokens``: ``{"totalTokens": len(body) // 4}``.

Every other path is a 404 in the API's error shape, recorded as well, so a test sees any request
the CLI should not have made. Every request is recorded with its query, headers, raw bytes and the
answer it got. ``scripted([...])`` answers by the number of ``model`` turns in ``contents`` (a
retried request gets the same reply); ``shell_call``, ``function_call``, ``text_reply`` and
``error_reply`` build the turns.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

from compose.harnesses import stub_server
from compose.harnesses.stub_server import QuietHandler, ServedStub, record_of

#: The CLI's own shell tool (``bash -c <command>``), the one a scripted turn calls by default.
SHELL_TOOL = "run_shell_command"

_GENERATING = (":streamGenerateContent", ":generateContent")


@dataclass
class Reply:
    chunks: list[list[dict[str, Any]]]  # the parts of each streamed chunk, in order
    finish_reason: str = "STOP"
    status: int = 200
    error: dict[str, Any] | None = None  # with status >= 400: {"code", "message", "status"}


class RecordedRequest(stub_server.RecordedRequest):
    """``response``: the GenerateContentResponse chunks (one for JSON), or the error body."""

    @property
    def route(self) -> str:
        """``streamGenerateContent``, ``generateContent``, ``countTokens`` or the bare path."""
        tail = self.path.rsplit("/", 1)[-1]
        return tail.split(":", 1)[1] if ":" in tail else self.path

    @property
    def model(self) -> str | None:
        """The model named in the path (``.../models/<model>:<method>``), slashes kept."""
        _, sep, rest = self.path.partition("/models/")
        return rest.rsplit(":", 1)[0] if sep and ":" in rest else None

Responder = Callable[[dict[str, Any]], Reply]


def text_reply(*pieces: str, thought: str | None = None) -> Reply:
    """A final answer streamed as one chunk per piece (after one ``thought`` chunk, if given)."""
    chunks = [[{"text": thought, "thought": True}]] if thought is not None else []
    return Reply([*chunks, *([{"text": p}] for p in pieces)])


def function_call(name: str, args: dict[str, Any], *, call_id: str | None = None,
                  pre: Sequence[str] = (), signature: str | None = None) -> Reply:
    """A turn that calls ``name(args)``: text chunks ``pre``, then one chunk with the ``functionCall``
    (with ``id`` and ``thoughtSignature`` when given; the CLI invents an id when there is none)."""
    call: dict[str, Any] = {"name": name, "args": args}
    if call_id is not None:
        call["id"] = call_id
    part: dict[str, Any] = {"functionCall": call}
    if signature is not None:
        part["thoughtSignature"] = signature
    return Reply([*([{"text": p}] for p in pre), [part]])


def shell_call(command: str, *, call_id: str | None = None, pre: Sequence[str] = ()) -> Reply:
    """A turn that runs ``command`` through the CLI's ``run_shell_command`` tool."""
    return function_call(SHELL_TOOL, {"command": command}, call_id=call_id, pre=pre)


def error_reply(status: int, message: str) -> Reply:
    names = {400: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE"}
    return Reply([], status=status, error={"code": status, "message": message,
                                           "status": names.get(status, "UNKNOWN")})


def model_turns(body: dict[str, Any]) -> int:
    return sum(1 for c in body.get("contents") or [] if isinstance(c, dict) and c.get("role") == "model")


def offers_tools(body: dict[str, Any]) -> bool:
    return any(isinstance(t, dict) and t.get("functionDeclarations") for t in body.get("tools") or [])


def scripted(replies: list[Reply], *, side_text: str = '{"reasoning": "done", "next_speaker": "user"}') -> Responder:
    """A deterministic model: the n-th reply for a request whose history holds n-1 ``model`` turns
    (the last reply repeats). A request that offers no tools (a side call: next-speaker check, loop
    detection, compression) gets ``side_text`` (a valid next-speaker verdict)."""

    def respond(body: dict[str, Any]) -> Reply:
        if not offers_tools(body):
            return text_reply(side_text)
        return copy.deepcopy(replies[min(model_turns(body), len(replies) - 1)])

    return respond


class RecordingGeminiStub(ServedStub):
    def __init__(self, responder: Responder | None = None, host: str = "127.0.0.1", port: int = 0,
                 *, model_version: str = "tokentrail-stub") -> None:
        self.responder = responder or scripted([text_reply("done")])
        self.model_version = model_version
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        stub = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                self._serve(b"")

            def do_POST(self) -> None:
                self._serve(self.read_body())

            def _serve(self, raw: bytes) -> None:
                request = stub._record(self, raw)
                path = request.path
                try:
                    if self.command == "POST" and path.endswith(":countTokens") and isinstance(request.body, dict):
                        self._json(request, 200, {"totalTokens": len(raw) // 4})
                    elif self.command == "POST" and path.endswith(_GENERATING) and isinstance(request.body, dict):
                        self._generate(request, stub.responder(request.body))
                    else:
                        self._json(request, 404, {"error": {"code": 404, "message": f"no such route {self.path}",
                                                            "status": "NOT_FOUND"}})
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True  # the client is gone (a run killed at its timeout)

            def _generate(self, request: RecordedRequest, reply: Reply) -> None:
                if reply.status >= 400:
                    self._json(request, reply.status, {"error": reply.error or {"code": reply.status}})
                    return
                chunks = stub._chunks(request.body, reply)
                if request.path.endswith(":generateContent"):
                    merged = copy.deepcopy(chunks[-1])
                    merged["candidates"][0]["content"]["parts"] = [p for c in reply.chunks for p in c]
                    self._json(request, 200, merged)
                    return
                request.status, request.response = 200, chunks
                data = b"".join(b"data: " + json.dumps(c).encode() + b"\r\n\r\n" for c in chunks)
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _json(self, request: RecordedRequest, status: int, payload: Any) -> None:
                request.status, request.response = status, payload
                self.send_json(status, payload)

        self._bind(host, port, Handler, name="gemini-stub")

    @property
    def base_url(self) -> str:
        """What the CLI gets as ``GOOGLE_GEMINI_BASE_URL`` (it appends ``/v1beta/models/...``)."""
        return self.url

    def generate_requests(self) -> list[RecordedRequest]:
        """The generating requests (streamed or not), in arrival order."""
        return [r for r in self.requests if r.method == "POST" and r.path.endswith(_GENERATING)]

    def _record(self, handler: BaseHTTPRequestHandler, raw: bytes) -> RecordedRequest:
        request = record_of(handler, raw, RecordedRequest)
        with self._lock:
            self.requests.append(request)
        return request

    def _chunks(self, body: dict[str, Any], reply: Reply) -> list[dict[str, Any]]:
        with self._lock:
            n = len(self.requests)
        parts_list = reply.chunks or [[{"text": ""}]]
        chunks: list[dict[str, Any]] = []
        for i, parts in enumerate(parts_list):
            candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
            chunk: dict[str, Any] = {"candidates": [candidate], "modelVersion": self.model_version,
                                     "responseId": f"stub-{n:04d}"}
            if i == len(parts_list) - 1:
                candidate["finishReason"] = reply.finish_reason
                # A count of the parts, not of the bytes: a run's varying bytes (a PGID) leave it alone.
                prompt = 64 * sum(len(c.get("parts") or []) for c in body.get("contents") or [] if isinstance(c, dict))
                out = 8 * len(parts_list)
                chunk["usageMetadata"] = {"promptTokenCount": prompt, "candidatesTokenCount": out,
                                          "totalTokenCount": prompt + out}
            chunks.append(chunk)
        return chunks


__all__ = ["SHELL_TOOL", "RecordedRequest", "RecordingGeminiStub", "Reply", "Responder", "error_reply",
           "function_call", "model_turns", "offers_tools", "scripted", "shell_call", "text_reply"]
