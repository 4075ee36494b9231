"""producers.services.engine_client: the proxy's engine client over a real loopback socket.

What the capture relies on from its transport: connections are reused, a connection the engine closed
is not reused, a stream reaches the reader chunk by chunk as the engine writes it (never buffered to its
end), and a stream closed early closes its connection (vLLM aborts a request whose connection closes).
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from producers.services import engine_client
from producers.settings import InterceptorSettings


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


def _client(port: int):
    return engine_client(InterceptorSettings(upstream_url=f"http://127.0.0.1:{port}", bootstrap="unused:9092"))


async def test_the_engine_client_serves_concurrent_calls_and_reuses_connections():
    server, port, opened = await _server()
    client = _client(port)
    try:
        for _ in range(3):
            answers = await asyncio.gather(*(client.post("/v1/chat/completions", content=b"{}") for _ in range(16)))
            assert [a.text for a in answers] == ["ok"] * 16
        assert len(opened) == 16  # the later rounds reused the first round's connections
    finally:
        await client.aclose()
        server.close()


async def test_a_connection_the_engine_closed_is_not_reused():
    server, port, opened = await _server(close_after=1)
    client = _client(port)
    try:
        for _ in range(3):
            assert (await client.get("/v1/models")).text == "ok"
            await asyncio.sleep(0.05)  # the server's close reaches the idle connection
        assert len(opened) == 3
    finally:
        await client.aclose()
        server.close()


async def test_a_stream_arrives_as_written_and_closing_it_early_closes_the_connection():
    release = asyncio.Event()
    closed = asyncio.Event()

    async def serve(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        event = b'data: {"n":1}\n\n'
        writer.write(b"%x\r\n%s\r\n" % (len(event), event))
        await writer.drain()
        await release.wait()  # the second event only once the reader has the first
        try:
            for _ in range(500):  # 5 s of events, unless the client closes the connection
                writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                await writer.drain()
                await asyncio.sleep(0.01)
                if reader.at_eof():
                    break
            if await reader.read() == b"":  # EOF: the client closed the connection
                closed.set()
        except (ConnectionError, OSError):  # or reset it
            closed.set()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    client = _client(server.sockets[0].getsockname()[1])
    try:
        response = await client.send(client.build_request("GET", "/v1/chat/completions"), stream=True)
        lines = response.aiter_lines()
        first = await asyncio.wait_for(anext(lines), 5)  # not held back until the stream ends
        assert first == 'data: {"n":1}'
        release.set()
        await anext(lines)
        await response.aclose()
        await asyncio.wait_for(closed.wait(), 5)
    finally:
        await client.aclose()
        server.close()


async def _dropping_server():
    """A server whose every connection answers one request, then drops the next unanswered: the race a
    keep-alive pool runs into when the engine closes an idle connection just as the client reuses it."""
    opened = []

    async def serve(reader, writer):
        opened.append(writer)
        for answered in range(2):
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            await reader.readexactly(length)
            if answered:
                break  # the second request on this connection: dropped unanswered
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: text/plain\r\n\r\nok")
            await writer.drain()
        writer.close()

    return await asyncio.start_server(serve, "127.0.0.1", 0), opened


async def _post_httpx(client):
    return (await client.post("/v1/chat/completions", content=b"{}")).text.encode()


async def _post_direct(client):  # the non-streamed generating call's request (producers.engine.direct)
    answer = await client.post_direct("/v1/chat/completions", b"{}", {})
    assert answer is not None
    try:
        return await answer.aread()
    finally:
        await answer.aclose()


@pytest.mark.parametrize("post", [_post_httpx, _post_direct], ids=["httpx", "direct"])
async def test_a_request_on_a_connection_the_engine_dropped_is_sent_again_once(post):
    server, opened = await _dropping_server()
    client = _client(server.sockets[0].getsockname()[1])
    try:
        assert await post(client) == b"ok"
        assert await post(client) == b"ok"  # on a new connection
        assert len(opened) == 2
    finally:
        await client.aclose()
        server.close()


# The non-streamed generating call's request, sent on the transport's aiohttp session (producers.engine.direct).

async def test_a_direct_post_shares_the_pool_and_answers_what_the_callers_read():
    server, port, opened = await _server()
    client = _client(port)
    try:
        for _ in range(3):
            answer = await client.post_direct("/v1/chat/completions", b"{}", {"content-type": "application/json"})
            assert answer is not None and answer.status_code == 200 and await answer.aread() == b"ok"
            await answer.aclose()
            assert (await client.post("/v1/chat/completions", content=b"{}")).text == "ok"  # the httpx path
        assert len(opened) == 1  # one connection, pooled across both paths
    finally:
        await client.aclose()
        server.close()


async def test_closing_an_unread_direct_answer_closes_its_connection():
    closed = asyncio.Event()

    async def serve(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(2)  # the request's body, b"{}"
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 1000000\r\ncontent-type: application/json\r\n\r\n{")
        await writer.drain()
        if await reader.read() == b"":  # the client closed the connection: vLLM would abort the request
            closed.set()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    client = _client(server.sockets[0].getsockname()[1])
    try:
        answer = await client.post_direct("/v1/chat/completions", b"{}", {})
        assert answer is not None
        await answer.aclose()
        await asyncio.wait_for(closed.wait(), 5)
    finally:
        await client.aclose()
        server.close()


async def test_a_direct_post_fails_with_httpx_errors_and_leaves_non_ascii_headers_to_httpx():
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    client = _client(port)
    try:
        assert await client.post_direct("/v1/chat/completions", b"{}", {"user-agent": b"h\xe9"}) is None
        raised = []
        for send in (lambda: client.post_direct("/v1/chat/completions", b"{}", {}),
                     lambda: client.post("/v1/chat/completions", content=b"{}")):
            try:
                await send()
            except httpx.TransportError as exc:  # recorded as "model server unreachable: <its repr>"
                raised.append(type(exc))
        assert len(raised) == 2 and raised[0] is raised[1]  # the same httpx error on both paths
    finally:
        await client.aclose()
