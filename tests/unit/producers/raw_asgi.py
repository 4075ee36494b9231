"""Drive an ASGI app with a hand-built scope: the exact ``path`` / ``raw_path`` a server (uvicorn) would give.

httpx normalises what these tests need to send (``//v1/models`` becomes a host ``v1``; a raw tab
is refused), so the paths a hostile client can put on the wire are sent here as the server
would decode them: uvicorn's ``path`` is ``unquote(raw_path)``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote


@dataclass
class RawResponse:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


async def call(app: Any, method: str, raw_path: bytes, *, body: bytes = b"",
               headers: list[tuple[bytes, bytes]] | None = None, path: str | None = None,
               disconnect: asyncio.Event | None = None, send_fails: asyncio.Event | None = None,
               spec_version: str | None = None, on_body: Callable[[bytes], None] | None = None) -> RawResponse:
    """One request; ``path`` defaults to what uvicorn makes of ``raw_path`` (percent-decoded).

    The client goes away when ``disconnect`` is set (``receive`` answers ``http.disconnect``, as
    uvicorn does), or its connection breaks once ``send_fails`` is set (``send`` raises OSError, as
    an ASGI 2.4 server does; ``spec_version="2.4"`` declares one); a test sets either from
    ``on_body``, called with each body chunk sent, e.g. once the first events arrived.
    """
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
        "path": unquote(raw_path.decode("ascii")) if path is None else path, "raw_path": raw_path,
        "query_string": b"", "root_path": "", "server": ("tt", 80), "client": ("127.0.0.1", 5000),
        "headers": [(b"host", b"tt"), (b"content-type", b"application/json"), *(headers or [])],
    }
    if spec_version is not None:
        scope["asgi"]["spec_version"] = spec_version
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        if disconnect is None:
            await asyncio.sleep(3600)  # the client never disconnects during a test
        else:
            await disconnect.wait()
        return {"type": "http.disconnect"}

    status: list[int] = []
    response_headers: list[tuple[bytes, bytes]] = []
    chunks: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        if send_fails is not None and send_fails.is_set():
            raise OSError("connection reset by peer")
        if message["type"] == "http.response.start":
            status.append(message["status"])
            response_headers.extend(message.get("headers", []))
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if on_body is not None:
                on_body(message.get("body", b""))

    await app(scope, receive, send)
    return RawResponse(status[0], response_headers, b"".join(chunks))
