"""What the recording API stubs (``compose.harnesses.claude_code``'s, ``compose.harnesses.codex``'s,
``compose.harnesses.gemini_cli``'s) share: the lifecycle of a stdlib ``ThreadingHTTPServer`` served
on a daemon thread for the length of a ``with`` block, a quiet HTTP/1.1 handler that reads bodies
and answers JSON, and the record of one request.

Guarantees: the socket is bound when the stub is constructed (port 0: a free one), so ``url``
is known before the block starts; requests are handled on daemon threads (a hung handler never
keeps the interpreter alive); leaving the block stops serving, closes the socket and joins the
serving thread (5 s at most). A recorded body is the parsed JSON, else the text (undecodable
bytes replaced), else None; ``raw`` keeps the bytes exactly as received.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self, TypeVar
from urllib.parse import parse_qsl, urlsplit


class ServedStub:
    """Base of a stub: call ``_bind`` with its handler class in ``__init__``."""

    _server: ThreadingHTTPServer
    _thread: threading.Thread | None = None
    _thread_name: str | None = None

    def _bind(self, host: str, port: int, handler: type[BaseHTTPRequestHandler], *, name: str | None = None) -> None:
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread = None
        self._thread_name = name

    @property
    def url(self) -> str:
        """``http://host:port`` of the bound socket."""
        host, port = self._server.server_address[:2]
        assert isinstance(host, str)  # an AF_INET address
        return f"http://{host}:{port}"

    def __enter__(self) -> Self:
        self._thread = threading.Thread(target=self._server.serve_forever, name=self._thread_name, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


class QuietHandler(BaseHTTPRequestHandler):
    """A stub's handler: HTTP/1.1 (the CLIs keep connections alive), no access log on stderr."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def read_body(self) -> bytes:
        """The request's body (``content-length`` bytes; none without the header)."""
        return self.rfile.read(int(self.headers.get("content-length") or 0))

    def send_json(self, status: int, payload: Any, *, headers: Mapping[str, str] | None = None) -> None:
        """``payload`` as a JSON response (``headers`` between content-type and content-length; no
        body to a HEAD)."""
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)


def parse_body(raw: bytes) -> Any:
    """The body as JSON, else as text (undecodable bytes replaced); None when empty."""
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


@dataclass
class RecordedRequest:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any  # parsed JSON, or the raw text, or None
    raw: bytes = b""  # the body exactly as received
    status: int | None = None  # what the stub answered
    response: Any = None  # what it answered with (the stub says what, for a stream)

    def as_dict(self) -> dict[str, Any]:
        return {"method": self.method, "path": self.path, "query": self.query, "headers": self.headers,
                "body": self.body, "status": self.status, "response": self.response}


R = TypeVar("R", bound=RecordedRequest)


def record_of(handler: BaseHTTPRequestHandler, raw: bytes, kind: type[R], *, keep_blank_values: bool = False) -> R:
    """``kind`` built from a request: its path and query apart, its headers with lower-case names."""
    url = urlsplit(handler.path)
    return kind(handler.command, url.path, dict(parse_qsl(url.query, keep_blank_values=keep_blank_values)),
                {k.lower(): v for k, v in handler.headers.items()}, parse_body(raw), raw)


__all__ = ["QuietHandler", "RecordedRequest", "ServedStub", "parse_body", "record_of"]
