"""``ClientLink``: events queued together reach the server in one send, in order; nothing waits for more."""

from __future__ import annotations

import asyncio
import json

import httpx

from producers.call.client_link import ClientLink
from tests.unit.producers import raw_asgi
from tests.unit.producers.test_cost_counters import CHAT, MESSAGES, _sse


async def test_events_queued_together_are_handed_in_one_send_in_order():
    link = ClientLink()
    for k in range(5):
        link.put(b"data: %d\n\n" % k, k + 1)
    body = link.body()
    assert await anext(body) == b"".join(b"data: %d\n\n" % k for k in range(5))
    link.put(b"data: 5\n\n", 6)
    link.end()
    assert await anext(body) == b"data: 5\n\n"
    assert (link.handed, link.sends, link.tokens_handed) == (5, 1, 5)  # counted as the server's send returns
    assert [piece async for piece in body] == [] and link.ended
    assert (link.handed, link.sends, link.tokens_handed) == (6, 2, 6)


async def test_an_event_queued_alone_goes_at_once():
    link = ClientLink()
    body = link.body()
    link.put(b"data: first\n\n", 1)
    # Nothing else is queued: the body does not hold it back waiting for a second event.
    assert await asyncio.wait_for(anext(body), 1.0) == b"data: first\n\n"
    waiting = asyncio.ensure_future(anext(body))
    await asyncio.sleep(0)
    assert not waiting.done()  # it waits for the next event, it does not end
    link.put(b"data: second\n\n", 2)
    assert await asyncio.wait_for(waiting, 1.0) == b"data: second\n\n"
    assert (link.handed, link.sends) == (1, 1)  # the second is counted once its send returns


async def test_the_end_queued_with_events_ends_the_stream_after_them():
    link = ClientLink()
    link.put(b"a", 1)
    link.put(b"b", 2)
    link.end()
    drained = asyncio.ensure_future(link.drained())
    assert [piece async for piece in link.body()] == [b"ab"]
    assert link.ended and link.handed == link.queued == 2
    await asyncio.wait_for(drained, 1.0)


async def test_a_stream_the_engine_delivered_at_once_takes_a_few_writes_not_one_per_token(app, upstream):
    # The counter behind the proxy's CPU per streamed call: one socket write per send. The engine's 40
    # chunks arrive in one read here, so the client's 40 events (and the terminal one) need not take 41.
    upstream.responses.append(httpx.Response(200, content=_sse(64, 40), headers={"content-type": "text/event-stream"}))
    sends: list[bytes] = []
    path = CHAT.format(rid="writes").encode()
    body = json.dumps({"model": "policy", "messages": MESSAGES, "stream": True}).encode()
    r = await raw_asgi.call(app, "POST", path, body=body, on_body=sends.append)
    assert r.status == 200 and r.body.count(b"data: ") == 41 and r.body.endswith(b"data: [DONE]\n\n")
    assert len([s for s in sends if s]) <= 4, f"{len(sends)} sends for 41 events"
