"""Call an ASGI app in-process, streaming: how the vLLM middleware reaches the engine it wraps.

httpx's timeouts do not reach an in-process app, so the caller bounds each wait itself
(``producers.call.dispatch.Deadlines``). A request the caller abandons (a deadline cancelled the wait, or
it closed the response early) is told so the way a server tells it: ``http.disconnect`` (vLLM then
aborts the generation); an app that still runs ``_ABANDON_GRACE_S`` later is cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
from starlette.types import ASGIApp, Message

from schemas.errors import TokentrailError

__all__ = ["InProcessEngineError", "StreamingASGITransport"]

_ABANDON_GRACE_S = 2.0  # how long an abandoned request may take to see its disconnect and stop


# Response extensions this transport does not implement are not offered to the engine.
_UNSUPPORTED_EXTENSIONS = frozenset({"http.response.pathsend", "http.response.zerocopy", "http.response.push",
                                     "http.response.trailers", "http.response.early_hint"})


class InProcessEngineError(TokentrailError, httpx.TransportError):
    """The in-process engine raised instead of answering (or in the middle of its answer)."""


class StreamingASGITransport(httpx.AsyncBaseTransport):
    """Call an ASGI app in-process and hand its response body over as it is sent (no buffering).

    ``outer`` returns the server scope's ``app``, ``state``, ``root_path`` and ``extensions``
    for the request (Starlette sets ``scope["app"]`` outside the user middleware)."""

    def __init__(self, app: ASGIApp, outer: Callable[[], dict[str, Any]] | None = None) -> None:
        self.app = app
        self.outer = outer or dict

    def _scope(self, request: httpx.Request, body_path: str) -> dict[str, Any]:
        outer = self.outer()
        root = outer.get("root_path", "") or ""
        path = root + body_path
        scope: dict[str, Any] = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": request.method,
            "scheme": request.url.scheme, "path": path, "raw_path": path.encode(),
            "query_string": request.url.query, "root_path": root,
            "headers": [(k.lower(), v) for k, v in request.headers.raw],
            "client": ("127.0.0.1", 0), "server": ("in-process", 80),
        }
        if "app" in outer:
            scope["app"] = outer["app"]
        if isinstance(outer.get("state"), dict):
            scope["state"] = dict(outer["state"])  # per request, like uvicorn's copy of the lifespan state
        if isinstance(outer.get("extensions"), dict):
            scope["extensions"] = {k: v for k, v in outer["extensions"].items() if k not in _UNSUPPORTED_EXTENSIONS}
        return scope

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        scope = self._scope(request, request.url.path)
        sent_body = False
        disconnected = asyncio.Event()

        async def receive() -> dict[str, Any]:
            nonlocal sent_body
            if not sent_body:
                sent_body = True
                return {"type": "http.request", "body": body, "more_body": False}
            await disconnected.wait()
            return {"type": "http.disconnect"}

        start: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        chunks: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue()

        async def send(message: Message) -> None:
            if message["type"] == "http.response.start" and not start.done():
                start.set_result(message)
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    chunks.put_nowait(message["body"])
                if not message.get("more_body", False):
                    chunks.put_nowait(None)

        async def run() -> None:
            try:
                await self.app(scope, receive, send)
            except Exception as exc:
                error = InProcessEngineError(f"the in-process engine raised {exc!r} serving "
                                             f"{request.method} {request.url.path}")
                error.__cause__ = exc
                if not start.done():
                    start.set_exception(error)
                else:
                    chunks.put_nowait(error)
            finally:
                chunks.put_nowait(None)
                if not start.done():
                    start.set_exception(InProcessEngineError(
                        f"the in-process engine returned without answering {request.method} {request.url.path}"))

        task = asyncio.get_running_loop().create_task(run())
        try:
            message = await start
        except BaseException:  # the caller gave up waiting (or the app failed): the app must not run on
            _abandon(task, disconnected)
            raise

        async def stream() -> AsyncIterator[bytes]:
            complete = False
            try:
                while (chunk := await chunks.get()) is not None:
                    if isinstance(chunk, BaseException):
                        raise chunk
                    yield chunk
                complete = True
            finally:
                if complete:
                    disconnected.set()
                    await task
                else:
                    _abandon(task, disconnected)

        return httpx.Response(message["status"], headers=message.get("headers", []),
                              stream=_AsyncStream(stream()), request=request)


def _abandon(task: asyncio.Task[None], disconnected: asyncio.Event) -> None:
    """The caller went away: the app gets http.disconnect, and is cancelled if it runs on regardless."""
    disconnected.set()
    if not task.done():
        asyncio.get_running_loop().call_later(_ABANDON_GRACE_S, task.cancel)


class _AsyncStream(httpx.AsyncByteStream):
    def __init__(self, iterator: AsyncIterator[bytes]) -> None:
        self._iterator = iterator

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._iterator:
            yield chunk

    async def aclose(self) -> None:
        await self._iterator.aclose()  # type: ignore[attr-defined]
