"""The interceptor as ASGI middleware inside vLLM's own server: ``vllm serve ... --middleware producers.middleware.TokentrailMiddleware``.

Same capture core as the standalone proxy; the "upstream" is the wrapped app
itself, called in-process through a streaming ASGI transport (httpx's own
ASGITransport buffers whole responses, which would break true streaming).
Paths under ``/ng-rollout/``, the control routes and ``/tokentrail/metrics`` go
to the interceptor; everything else goes straight to the wrapped app.

vLLM constructs middleware with the app only, so settings come from the
environment and are validated when the middleware is built (before vLLM
serves anything): ``TOKENTRAIL_BOOTSTRAP`` (required), ``TOKENTRAIL_SPOOL_DIR``,
``TOKENTRAIL_CONTROL_TOKEN``, ``TOKENTRAIL_SAMPLING`` (JSON), ``TOKENTRAIL_TOPIC_PREFIX``,
``TOKENTRAIL_PREFIX_SUPPLY`` (1/0), ``TOKENTRAIL_DELTA_RECORDS`` (1/0).
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any, AsyncIterator

import httpx
from starlette.types import ASGIApp, Receive, Scope, Send

from producers.app import Interceptor
from producers.settings import InterceptorSettings
from schemas.errors import ConfigError
from schemas.topics import topic_names

_OURS = ("/ng-rollout/", "/rollouts/", "/tokentrail/admin/")


def settings_from_env(env: dict[str, str] | None = None) -> InterceptorSettings:
    env = dict(os.environ if env is None else env)
    if not env.get("TOKENTRAIL_BOOTSTRAP"):
        raise ConfigError("TOKENTRAIL_BOOTSTRAP is not set: the middleware needs the Kafka bootstrap servers (host:port)")
    try:
        return InterceptorSettings(
            upstream_url="http://in-process",
            bootstrap=env["TOKENTRAIL_BOOTSTRAP"],
            spool_dir=env.get("TOKENTRAIL_SPOOL_DIR") or None,
            control_token=env.get("TOKENTRAIL_CONTROL_TOKEN") or None,
            sampling_overrides=json.loads(env.get("TOKENTRAIL_SAMPLING") or "{}"),
            topics=topic_names(env.get("TOKENTRAIL_TOPIC_PREFIX", "")),
            prefix_supply=env.get("TOKENTRAIL_PREFIX_SUPPLY", "0") == "1",
            delta_records=env.get("TOKENTRAIL_DELTA_RECORDS", "1") == "1",
        )
    except ValueError as exc:  # pydantic's ValidationError and bad JSON
        raise ConfigError(f"invalid TOKENTRAIL_* settings for the vLLM middleware: {exc}") from exc


class TokentrailMiddleware:
    def __init__(self, app: ASGIApp, settings: InterceptorSettings | None = None, **overrides: Any) -> None:
        self.app = app
        settings = settings or settings_from_env()
        self.interceptor = Interceptor(
            settings,
            upstream=httpx.AsyncClient(transport=StreamingASGITransport(app), base_url="http://in-process",
                                       timeout=httpx.Timeout(settings.upstream_timeout_s)),
            **overrides,
        )
        self._started: asyncio.Lock | None = None
        self._ready = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope.get("path", "")
            if path.startswith(_OURS) or path == "/tokentrail/metrics":
                await self._ensure_started()
                if path == "/tokentrail/metrics":
                    scope = {**scope, "path": "/metrics"}
                await self.interceptor(scope, receive, send)
                return
        if scope["type"] == "lifespan":
            await self.app(scope, receive, self._on_lifespan_send(send))
            return
        await self.app(scope, receive, send)

    async def _ensure_started(self) -> None:
        if self._ready:
            return
        self._started = self._started or asyncio.Lock()
        async with self._started:
            if not self._ready:
                await self.interceptor.startup()
                self._ready = True

    def _on_lifespan_send(self, send: Send) -> Send:
        async def wrapped(message: dict[str, Any]) -> None:
            if message["type"] == "lifespan.shutdown.complete" and self._ready:
                await self.interceptor.shutdown()
            await send(message)

        return wrapped


class StreamingASGITransport(httpx.AsyncBaseTransport):
    """Call an ASGI app in-process and hand its response body over as it is sent (no buffering)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": request.method,
            "scheme": request.url.scheme, "path": request.url.path, "raw_path": request.url.raw_path.split(b"?")[0],
            "query_string": request.url.query, "root_path": "",
            "headers": [(k.lower(), v) for k, v in request.headers.raw],
            "client": ("127.0.0.1", 0), "server": ("in-process", 80),
        }
        sent_body = False
        disconnected = asyncio.Event()

        async def receive() -> dict[str, Any]:
            nonlocal sent_body
            if not sent_body:
                sent_body = True
                return {"type": "http.request", "body": body, "more_body": False}
            await disconnected.wait()
            return {"type": "http.disconnect"}

        start: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        chunks: asyncio.Queue[bytes | None] = asyncio.Queue()

        async def send(message: dict[str, Any]) -> None:
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
                if not start.done():
                    start.set_exception(exc)
            finally:
                chunks.put_nowait(None)

        task = asyncio.get_running_loop().create_task(run())
        message = await start

        async def stream() -> AsyncIterator[bytes]:
            try:
                while (chunk := await chunks.get()) is not None:
                    yield chunk
            finally:
                disconnected.set()
                await task

        return httpx.Response(message["status"], headers=message.get("headers", []),
                              stream=_AsyncStream(stream()), request=request)


class _AsyncStream(httpx.AsyncByteStream):
    def __init__(self, iterator: AsyncIterator[bytes]) -> None:
        self._iterator = iterator

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._iterator:
            yield chunk

    async def aclose(self) -> None:
        await self._iterator.aclose()  # type: ignore[attr-defined]
