"""The proxy's engine client, and the non-streamed generating call's request sent straight on aiohttp.

``EngineClient`` is an ``httpx.AsyncClient`` over an aiohttp transport (``producers.services.engine_client``
builds it): everything that talks to the engine uses httpx's API. The one request every non-streamed
captured call makes (``producers.call.dispatch.send_chat``) skips httpx's layers instead:
``EngineClient.post_direct`` sends it on the same ``aiohttp.ClientSession``, so the same pool, limits and
idle expiry, and answers a ``DirectAnswer``, which has the three things a caller uses of an httpx
response: ``status_code``, ``aread()`` and ``aclose()``. Building the ``httpx.Request``, its URL parse and
the response wrapper cost ~0.65 ms of CPU per 8k/512 call on loopback (1.0 vs 0.3 ms per request,
docs/perf/interceptor.md), a tenth of the proxy's CPU per call.

Guarantees, the same as the httpx path's:

- errors are httpx's exception types (``httpx_aiohttp.map_aiohttp_exceptions``), so a failure is
  recorded and worded as before;
- a request whose pooled connection the engine had closed before any answer is sent again, once, on a
  new connection (its body is in memory), like ``EngineTransport``;
- ``aclose()`` of an answer not read to its end closes its connection (vLLM aborts the request);
- the header bytes are the ones httpx would send: a value that is not ASCII is not sent this way
  (``post_direct`` returns None and the caller takes the httpx path).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import httpx

__all__ = ["DirectAnswer", "EngineClient"]


class DirectAnswer:
    """An engine answer on the direct path: what ``send_chat``'s callers use of an ``httpx.Response``."""

    __slots__ = ("_response", "_read", "status_code")

    def __init__(self, response: Any) -> None:
        self._response, self._read, self.status_code = response, False, int(response.status)

    async def aread(self) -> bytes:
        from httpx_aiohttp.transport import map_aiohttp_exceptions

        with map_aiohttp_exceptions():
            content: bytes = await self._response.read()
        self._read = True
        return content

    async def aclose(self) -> None:
        # Unread, the connection is closed, not pooled: vLLM aborts a request whose connection closes.
        if self._read:
            self._response.release()
        else:
            self._response.close()


class EngineClient(httpx.AsyncClient):
    """httpx's client to the engine, whose transport's aiohttp session also serves ``post_direct``.

    ``session`` returns the transport's ``aiohttp.ClientSession`` (created on first use, in the event loop);
    ``replay`` says whether a failed request's httpx error means the engine closed the pooled connection before
    answering (the transport's own rule, ``producers.services``).
    """

    def __init__(self, *, session: Callable[[], Any], replay: Callable[[httpx.TransportError], bool], read_timeout: float,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._direct_session, self._direct_replay, self._direct_read_timeout = session, replay, read_timeout
        self._direct_urls: dict[str, str] = {}
        self._direct_timeout: Any = None

    async def post_direct(self, path: str, content: bytes,
                          headers: Mapping[str, str | bytes]) -> DirectAnswer | None:
        """POST ``content`` to ``path`` (status and headers read, body unread); None when a header value is
        not ASCII (send it through httpx, which sends its bytes as they are). Raises httpx's errors."""
        if any(type(v) is not str for v in headers.values()):
            return None
        from httpx_aiohttp.transport import map_aiohttp_exceptions

        url = self._direct_urls.get(path)
        if url is None:
            url = self._direct_urls[path] = str(self.build_request("POST", path).url)
        if self._direct_timeout is None:
            import aiohttp

            # httpx's timeouts as the transport maps them: connect 10 s, a read backstop of engine_timeout_s
            # (the call's own deadlines are the interceptor's, around this request).
            self._direct_timeout = aiohttp.ClientTimeout(sock_connect=10.0, sock_read=self._direct_read_timeout,
                                                         connect=self._direct_read_timeout)
        session = self._direct_session()
        for attempt in (1, 2):
            try:
                with map_aiohttp_exceptions():
                    response = await session.request("POST", url, data=content, headers=headers,
                                                     allow_redirects=False, timeout=self._direct_timeout)
                return DirectAnswer(response)
            except httpx.TransportError as exc:
                if attempt == 2 or not self._direct_replay(exc):
                    raise
        raise AssertionError("unreachable: the second attempt returns or raises")
