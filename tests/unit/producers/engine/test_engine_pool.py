"""producers.engine.pool: the same pool decisions as httpcore's own, and a working client over a real socket."""

from __future__ import annotations

import asyncio
import random

import httpcore
import httpx
import pytest

from producers.engine.pool import HTTPCORE_PRIVATE_NAMES, _assign_requests_to_connections, linear_pool
from producers.services import engine_client
from producers.settings import InterceptorSettings


def test_the_private_names_exist_in_the_pinned_httpx_and_httpcore():
    client = httpx.AsyncClient()
    pool = client._transport._pool
    owners = {"httpx.AsyncClient": client, "httpx.AsyncHTTPTransport": client._transport,
              "httpcore.AsyncConnectionPool": pool}
    for owner, name in HTTPCORE_PRIVATE_NAMES:
        assert hasattr(owners[owner], name), f"{owner}.{name} is gone: re-check producers.engine.pool"


class FakeConnection:
    def __init__(self, n: int, rng: random.Random, origin: str) -> None:
        self.n, self.origin = n, origin
        self.state = rng.choice(["idle", "active", "closed", "expired", "new"])

    def is_closed(self): return self.state == "closed"
    def has_expired(self): return self.state == "expired"
    def is_idle(self): return self.state == "idle"
    def is_available(self): return self.state == "idle"
    def can_handle_request(self, origin): return origin == self.origin


class FakeRequest:
    def __init__(self, origin: str, queued: bool) -> None:
        self.request = type("R", (), {"url": type("U", (), {"origin": origin})()})()
        self.queued, self.connection = queued, None

    def is_queued(self): return self.queued

    def assign_to_connection(self, connection):
        self.queued, self.connection = False, connection.n


def _decisions(assign, seed: int):
    rng = random.Random(seed)
    pool = httpcore.AsyncConnectionPool(max_connections=rng.randint(1, 12), max_keepalive_connections=rng.randint(0, 8))
    origins = ["a", "b"]
    pool._connections = [FakeConnection(i, rng, rng.choice(origins)) for i in range(rng.randint(0, 14))]
    pool._requests = [FakeRequest(rng.choice(origins), rng.random() < 0.6) for _ in range(rng.randint(0, 6))]
    made = iter(range(100, 200))

    def create_connection(origin):
        c = FakeConnection(next(made), rng, origin)
        c.state = "new"
        return c

    pool.create_connection = create_connection
    closing = assign(pool)
    return ([c.n for c in closing], [c.n for c in pool._connections],
            [(r.queued, r.connection) for r in pool._requests])


@pytest.mark.parametrize("seed", range(400))
def test_the_linear_assignment_decides_as_httpcore_does(seed):
    assert _decisions(_assign_requests_to_connections, seed) == \
        _decisions(httpcore.AsyncConnectionPool._assign_requests_to_connections, seed)


async def _server(close_after: int | None = None):
    """A keep-alive HTTP/1.1 server on loopback; closes a connection after ``close_after`` answers."""
    opened = []

    async def serve(reader, writer):
        opened.append(writer)
        answered = 0
        while True:
            head = await reader.readuntil(b"\r\n\r\n") if not reader.at_eof() else b""
            if not head:
                break
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            await reader.readexactly(length)
            await asyncio.sleep(0.01)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: text/plain\r\n\r\nok")
            await writer.drain()
            answered += 1
            if close_after is not None and answered >= close_after:
                break
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], opened


async def test_the_engine_client_serves_concurrent_calls_and_reuses_connections():
    server, port, opened = await _server()
    client = engine_client(InterceptorSettings(upstream_url=f"http://127.0.0.1:{port}", bootstrap="unused:9092"))
    try:
        for _ in range(3):
            answers = await asyncio.gather(*(client.post("/v1/chat/completions", content=b"{}") for _ in range(16)))
            assert [a.text for a in answers] == ["ok"] * 16
        assert len(opened) == 16  # the later rounds reused the first round's connections
    finally:
        await client.aclose()
        server.close()


async def test_a_connection_the_engine_closed_is_noticed_before_reuse():
    server, port, opened = await _server(close_after=1)
    client = linear_pool(httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}"))
    try:
        for _ in range(3):
            assert (await client.get("/v1/models")).text == "ok"
            await asyncio.sleep(0.05)  # the server's close reaches the idle connection: readable, so dropped
        assert len(opened) == 3
    finally:
        await client.aclose()
        server.close()


def test_another_httpcore_release_is_left_as_it_is(monkeypatch):
    import httpcore
    import httpx

    from producers.engine.pool import linear_pool

    monkeypatch.setattr(httpcore, "__version__", "1.0.10")
    client = httpx.AsyncClient()
    pool = client._transport._pool
    linear_pool(client)
    assert "_assign_requests_to_connections" not in vars(pool), "a release whose algorithm was not copied is rebound"
