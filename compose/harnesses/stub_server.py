"""The lifecycle of a recording API stub (``compose.harnesses.claude_code``'s, ``compose.harnesses.codex``'s): a
stdlib ``ThreadingHTTPServer`` served on a daemon thread for the length of a ``with`` block.

Guarantees: the socket is bound when the stub is constructed (port 0: a free one), so ``url``
is known before the block starts; requests are handled on daemon threads (a hung handler never
keeps the interpreter alive); leaving the block stops serving, closes the socket and joins the
serving thread (5 s at most).
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


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
