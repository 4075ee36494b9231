"""The client's side of a streamed call: the events the pump queued, handed to the server as it takes them.

``ClientLink`` is what the pump (``producers.call.stream``) and the response share: the queue of events for
the client, how many the server took (its send returned) and how many generated tokens they carried, and
whether the client left before the end. ``ClientStream`` is the SSE response that drains it and tells the
link when it is over, however it ended (a client gone, a failed send, the request cancelled).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

if TYPE_CHECKING:
    from producers.engine.chat_stream import ChatStreamAccumulator

__all__ = ["ClientLink", "ClientStream"]


class ClientLink:
    """The client's side of one stream, as the pump sees it: what was queued, what the server took, who left."""

    __slots__ = ("queue", "queued", "handed", "tokens_handed", "ended", "left", "committed", "pump", "_drained")

    def __init__(self) -> None:
        self.queue: asyncio.Queue[tuple[bytes, int] | None] = asyncio.Queue()
        self.queued = 0  # events queued for the client
        self.handed = 0  # events the server took (its send returned)
        self.tokens_handed = 0  # generated tokens in what the server took
        self.ended = False  # the end of the stream was handed to the server
        self.left = False  # the client went away before that
        self.committed = False  # the pump is writing the call's record: the client leaving no longer stops it
        self.pump: asyncio.Task[None] | None = None
        self._drained: asyncio.Future[None] | None = None

    def put(self, piece: bytes, tokens: int) -> None:
        self.queued += 1
        self.queue.put_nowait((piece, tokens))

    def end(self) -> None:
        self.queue.put_nowait(None)

    async def body(self) -> AsyncIterator[bytes]:
        while (item := await self.queue.get()) is not None:
            yield item[0]
            # Resumed: the server's send of that event returned.
            self.handed += 1
            self.tokens_handed = item[1]
            if self._drained is not None and self.handed >= self.queued and not self._drained.done():
                self._drained.set_result(None)
        self.ended = True

    def closed(self) -> None:
        """The response is over, however it ended; if its end was not handed to the server, the client left."""
        if self.ended or self.left:
            return
        self.left = True
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        if not self.committed and self.pump is not None and not self.pump.done():
            self.pump.cancel()  # it waits on the engine or on the client: stop it, it records why

    async def drained(self) -> None:
        """Return once every queued event was handed to the server, or the client left."""
        if self.left or self.handed >= self.queued:
            return
        self._drained = asyncio.get_running_loop().create_future()
        await self._drained

    def left_detail(self, acc: ChatStreamAccumulator) -> str:
        return (f"the client disconnected before the end of its stream: it was handed {self.handed} of "
                f"{self.queued} event(s), {self.tokens_handed} generated token(s), after {acc.chunks} engine "
                "chunk(s); the engine stream was closed (the engine aborts the request) and nothing was captured")


class ClientStream(StreamingResponse):
    """The SSE answer of a streamed call; tells its ``ClientLink`` when it is over, however it ended."""

    def __init__(self, link: ClientLink) -> None:
        super().__init__(link.body(), media_type="text/event-stream",
                         headers={"cache-control": "no-cache", "x-accel-buffering": "no"})
        self.link = link

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.link.closed()
