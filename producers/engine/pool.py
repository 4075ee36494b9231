"""The engine client's connection pool bookkeeping, made linear in its connections (same decisions).

A proxy holds one HTTP/1.1 connection to the engine per call in flight (64 at the
benchmark's concurrency, hundreds in a large run), and httpcore 1.0.9 pays for each
of them on every request and on every response close:

- ``AsyncConnectionPool._assign_requests_to_connections`` evaluates
  ``len([c.is_idle() for c in connections])`` inside its loop over the connections:
  O(n²) ``is_idle`` calls per request (1.4 M calls for 272 calls at 64-way
  concurrency; with the next point, 38% of the interceptor's event-loop time in the
  proxy benchmark, all of it added latency the harness sees);
- every idle connection's ``has_expired`` asks anyio's stream for ``is_readable``,
  which builds anyio's whole ``extra_attributes`` mapping (a dict of lambdas, a
  ``getpeername``) before polling the socket: ~35 µs per idle connection per request.

``linear_pool(client)`` rebinds both on the client's pools: the same assignment
algorithm with the list length read once (the expression above is the number of
connections: it counts every connection, idle or not), and streams that keep their
raw socket, so ``is_readable`` is one ``poll``, as httpcore's own check does it.
Which connection serves which request, when one is opened, closed or reused, is
unchanged. httpx/httpcore names it relies on are in ``HTTPCORE_PRIVATE_NAMES``
(pinned by tests/unit/producers/test_engine_pool.py, as the Faust ones are), and the
rebinding applies only to the httpcore release whose algorithm it copies
(``HTTPCORE_VERSION``, pinned in pyproject.toml); any other release is left as it is.

This is a stop-gap for a known upstream problem: encode/httpx#3215, and the rewrite
proposed in encode/httpcore#1035 (open) and merged in the pydantic/httpx2 fork (#974).
Drop it when the pinned httpcore has a linear pool.
"""

from __future__ import annotations

import select
import types
from typing import Any

import httpcore
import httpx

__all__ = ["HTTPCORE_PRIVATE_NAMES", "HTTPCORE_VERSION", "linear_pool"]

HTTPCORE_VERSION = "1.0.9"  # the release whose _assign_requests_to_connections is copied below

_NO_POLL = getattr(select, "poll", None) is None  # httpcore then uses select.select: leave it to httpcore

HTTPCORE_PRIVATE_NAMES: tuple[tuple[str, str], ...] = (
    ("httpx.AsyncClient", "_transport"),  # the default transport, and _mounts: the proxy ones
    ("httpx.AsyncClient", "_mounts"),
    ("httpx.AsyncHTTPTransport", "_pool"),  # its httpcore pool
    ("httpcore.AsyncConnectionPool", "_assign_requests_to_connections"),  # rebound: linear
    ("httpcore.AsyncConnectionPool", "_network_backend"),  # wrapped: a cheap is_readable
    ("httpcore.AsyncConnectionPool", "_connections"),  # read and edited by the assignment, as httpcore does
    ("httpcore.AsyncConnectionPool", "_requests"),
    ("httpcore.AsyncConnectionPool", "_max_connections"),
    ("httpcore.AsyncConnectionPool", "_max_keepalive_connections"),
)


def linear_pool(client: httpx.AsyncClient) -> httpx.AsyncClient:
    """Rebind the bookkeeping of every httpcore pool of ``client`` (see the module docstring); returns it."""
    if httpcore.__version__ != HTTPCORE_VERSION:
        return client  # another algorithm: copying 1.0.9's over it could change which connection serves what
    for transport in (client._transport, *client._mounts.values()):
        pool = getattr(transport, "_pool", None)
        if isinstance(pool, httpcore.AsyncConnectionPool):
            # Rebinding the method is the point (the module docstring).
            pool._assign_requests_to_connections = types.MethodType(  # type: ignore[method-assign]
                _assign_requests_to_connections, pool)
            if not isinstance(pool._network_backend, _SocketKeepingBackend):
                pool._network_backend = _SocketKeepingBackend(pool._network_backend)
    return client


def _assign_requests_to_connections(self: httpcore.AsyncConnectionPool) -> list[Any]:
    """httpcore 1.0.9's algorithm, step for step, without its quadratic idle count."""
    closing: list[Any] = []
    connections = self._connections
    for connection in list(connections):
        if connection.is_closed():
            connections.remove(connection)
        elif connection.has_expired():
            connections.remove(connection)
            closing.append(connection)
        elif connection.is_idle() and len(connections) > self._max_keepalive_connections:
            connections.remove(connection)
            closing.append(connection)
    for pool_request in [request for request in self._requests if request.is_queued()]:
        origin = pool_request.request.url.origin
        available = next((c for c in connections if c.can_handle_request(origin) and c.is_available()), None)
        if available is not None:
            pool_request.assign_to_connection(available)
        elif len(connections) < self._max_connections:
            connection = self.create_connection(origin)
            connections.append(connection)
            pool_request.assign_to_connection(connection)
        else:
            idle = next((c for c in connections if c.is_idle()), None)
            if idle is not None:
                connections.remove(idle)
                closing.append(idle)
                connection = self.create_connection(origin)
                connections.append(connection)
                pool_request.assign_to_connection(connection)
    return closing


class _SocketKeepingStream(httpcore.AsyncNetworkStream):
    """A network stream that answers ``is_readable`` from its raw socket, kept from the start."""

    __slots__ = ("_stream", "_sock")

    def __init__(self, stream: httpcore.AsyncNetworkStream) -> None:
        self._stream = stream
        self._sock = stream.get_extra_info("socket")

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._stream.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self._stream.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                        timeout: float | None = None) -> httpcore.AsyncNetworkStream:
        return _SocketKeepingStream(await self._stream.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        if info != "is_readable" or self._sock is None or _NO_POLL:
            return self._stream.get_extra_info(info)
        # httpcore's is_socket_readable: a socket gone (fd < 0) counts as readable (about to give b"").
        fd = self._sock.fileno()
        if fd < 0:
            return True
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))


class _SocketKeepingBackend(httpcore.AsyncNetworkBackend):
    """The pool's backend, its streams wrapped in ``_SocketKeepingStream``."""

    def __init__(self, backend: httpcore.AsyncNetworkBackend) -> None:
        self._backend = backend

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                          socket_options: Any = None) -> httpcore.AsyncNetworkStream:
        return _SocketKeepingStream(await self._backend.connect_tcp(host, port, timeout, local_address,
                                                                    socket_options))

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Any = None) -> httpcore.AsyncNetworkStream:
        return _SocketKeepingStream(await self._backend.connect_unix_socket(path, timeout, socket_options))

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)
