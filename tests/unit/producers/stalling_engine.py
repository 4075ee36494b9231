"""A vLLM-shaped engine whose answers can stall, trickle or run long, for httpx.MockTransport or in process.

``StallingEngine`` answers chat completions (streamed or not) with prompt ids ``[1, 2]`` and ``n_tokens``
generated tokens. ``stall`` picks where it goes silent forever: ``"answer"`` (no response at all),
``"everything"`` (not even ``GET /v1/models``), or a
chunk number of the stream (0: before its first chunk, the prefill; 2: after two chunks). ``interval``
spaces the chunks. It records what the interceptor did to it: ``dispatched`` (chat requests),
``produced`` (token chunks it sent), ``closed`` (set when its request was closed or cancelled: vLLM aborts
such a request), and ``on_dispatch`` runs as each chat request arrives. In process (``asgi``) it stops on
``http.disconnect`` as vLLM does, unless ``ignore_disconnect``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
from starlette.responses import JSONResponse, StreamingResponse

__all__ = ["StallingEngine"]

MODELS = {"object": "list", "data": [{"id": "policy", "object": "model", "max_model_len": 4096}]}


class StallingEngine:
    def __init__(self, *, stall: int | str | None = None, n_tokens: int = 3, interval: float = 0.0) -> None:
        self.stall, self.n_tokens, self.interval = stall, n_tokens, interval
        self.dispatched = 0
        self.produced = 0
        self.closed = asyncio.Event()
        self.on_dispatch: Callable[[], None] | None = None
        self.ignore_disconnect = False  # in process: an app that never reads its http.disconnect

    # -- httpx.MockTransport -----------------------------------------------------------------
    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url="http://engine", transport=httpx.MockTransport(self.handler))

    async def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            if self.stall == "everything":
                await self._forever()
            return httpx.Response(200, json=MODELS)
        body = json.loads(request.content)
        await self._dispatch()
        if body.get("stream"):
            return httpx.Response(200, stream=_Stream(self), headers={"content-type": "text/event-stream"})
        return httpx.Response(200, json=self.answer())

    # -- in process (the vLLM middleware's engine) ----------------------------------------------
    async def asgi(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/v1/models":
            await JSONResponse(MODELS)(scope, receive, send)
            return
        message = await receive()
        body = json.loads(message.get("body") or b"{}")
        if self.ignore_disconnect:
            await self._dispatch()
        else:  # as vLLM's with_cancellation: a disconnect cancels the handler (and aborts the request)
            handler, listener = asyncio.ensure_future(self._dispatch()), asyncio.ensure_future(receive())
            done, pending = await asyncio.wait({handler, listener}, return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()
            if handler not in done:
                return
        if body.get("stream"):  # as vLLM: a starlette stream, which stops when the client disconnects
            await StreamingResponse(self._chunks(), media_type="text/event-stream")(scope, receive, send)
        else:
            await JSONResponse(self.answer())(scope, receive, send)

    # -- the answers ---------------------------------------------------------------------------
    async def _dispatch(self) -> None:
        self.dispatched += 1
        if self.on_dispatch is not None:
            self.on_dispatch()
        if self.stall in ("answer", "everything"):
            await self._forever()

    async def _forever(self) -> None:
        try:
            await asyncio.sleep(3600)
        finally:  # cancelled: the interceptor closed the request
            self.closed.set()

    def answer(self) -> dict[str, Any]:
        gen = list(range(5, 5 + self.n_tokens))
        return {"id": "chatcmpl-x", "object": "chat.completion", "model": "policy", "prompt_token_ids": [1, 2],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop",
                             "token_ids": gen, "logprobs": {"content": [
                                 {"token": f"t{t}", "logprob": -0.5, "bytes": [], "top_logprobs": []} for t in gen]}}],
                "usage": {"prompt_tokens": 2, "completion_tokens": len(gen)}}

    async def _chunks(self) -> AsyncIterator[bytes]:
        try:
            for i in range(self.n_tokens + 1):
                if self.stall == i:
                    await self._forever()
                if self.interval and i:
                    await asyncio.sleep(self.interval)
                if i == 0:
                    yield _sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
                                "prompt_token_ids": [1, 2]})
                    continue
                last = i == self.n_tokens
                self.produced += 1
                yield _sse({"choices": [{"index": 0, "delta": {"content": f"w{i} "}, "token_ids": [4 + i],
                                         "logprobs": {"content": [{"token": f"w{i}", "logprob": -0.5}]},
                                         "finish_reason": "stop" if last else None}]})
            yield b"data: [DONE]\n\n"
        finally:
            if self.produced < self.n_tokens:
                self.closed.set()


class _Stream(httpx.AsyncByteStream):
    def __init__(self, engine: StallingEngine) -> None:
        self.engine = engine
        self.chunks = engine._chunks()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.chunks:
            yield chunk

    async def aclose(self) -> None:
        await self.chunks.aclose()
        if self.engine.produced < self.engine.n_tokens:
            self.engine.closed.set()


def _sse(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps({"object": "chat.completion.chunk", "model": "policy", **data}).encode() + b"\n\n"
