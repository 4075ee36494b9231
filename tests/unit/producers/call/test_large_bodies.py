"""Large request bodies (issue 26, finding 2): prepared off the event loop, with the results of the loop's path.

A body over ``LARGE_BODY_BYTES`` is read, checked, hashed, described and encoded for the engine in the
lane's worker thread (``producers.call.large_bodies``); a smaller one on the loop, as always. No timing is asserted: the
tests block a large body's preparation on an Event and show the loop serving meanwhile, count the
steps each path offloads, and compare what the engine and the publisher got on both paths.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from typing import Any

import httpx
import pytest

import producers.call.generation as generation
import producers.capture.core as core_module
from producers.call.large_bodies import LARGE_BODY_BYTES, LargeBodies
from producers.http.app import Interceptor
from producers.settings import InterceptorSettings
from schemas.records import CallCaptured, ParentResolution
from tests.unit.producers.conftest import vllm_chat_response

CHAT = "/ng-rollout/{}/training-token-capture/v1/chat/completions"
BLOCKED_FOR_S = 10.0  # a preparation wrongly on the loop gives up after this, so a regression fails, never hangs


def conversation(turns: int = 40, size: int = 30_000) -> list[dict[str, Any]]:
    """Over 1 MiB of chat: long user turns, assistant turns with tool calls and their results."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"turn {i}: " + "word " * (size // 5)})
        messages.append({"role": "assistant", "content": f"looking {i}", "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": "search", "arguments": json.dumps({"q": i})}}]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"found {i}"})
    messages.append({"role": "user", "content": "and now?"})
    return messages


def chat_body(messages: list[dict[str, Any]]) -> bytes:
    return json.dumps({"model": "policy", "max_tokens": 8, "messages": messages}).encode()


class Engine:
    """A vLLM stand-in that keeps each request's exact bytes and answers in order."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.answers: list[dict[str, Any]] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(200, json={"object": "list", "data": [{"id": "policy", "max_model_len": 10**7}]})
        self.sent.append(request.content)
        return httpx.Response(200, json=self.answers.pop(0))


@pytest.fixture
async def rig(publisher):
    engine = Engine()
    settings = InterceptorSettings(upstream_url="http://engine", bootstrap="unused:9092", control_token="s3cret")
    upstream = httpx.AsyncClient(base_url="http://engine", transport=httpx.MockTransport(engine.handler))
    app = Interceptor(settings, publisher=publisher, upstream=upstream)  # type: ignore[arg-type]
    await app.startup()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://tt", timeout=60) as http:
        yield http, app, engine
    await app.shutdown()
    await upstream.aclose()


def test_the_conversation_is_a_large_body():
    assert len(chat_body(conversation())) > LARGE_BODY_BYTES


async def test_a_large_bodys_preparation_runs_off_the_loop_while_the_loop_serves(rig, monkeypatch):
    http, app, engine = rig
    engine.answers.append(vllm_chat_response([1, 2], [3]))
    entered, gate = threading.Event(), threading.Event()
    threads: dict[str, int] = {}
    chat = app.adapters["chat"]
    parse, prefix_digests = chat.parse, core_module.conversation_prefix_digests

    def blocked_parse(body, **route):
        threads["parse"] = threading.get_ident()
        entered.set()
        assert gate.wait(BLOCKED_FOR_S), "the preparation was never let go: it held the event loop"
        return parse(body, **route)

    def recorded_digests(items):
        threads["describe"] = threading.get_ident()
        return prefix_digests(items)

    monkeypatch.setattr(chat, "parse", blocked_parse)
    monkeypatch.setattr(core_module, "conversation_prefix_digests", recorded_digests)
    call = asyncio.ensure_future(http.post(CHAT.format("r-big"), content=chat_body(conversation())))
    assert await asyncio.to_thread(entered.wait, BLOCKED_FOR_S)
    health = await http.get("/healthz")  # answered while the body's parse is held in its worker
    gate.set()
    response = await call
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert response.status_code == 200, response.text
    loop_thread = threading.get_ident()
    assert threads.keys() == {"parse", "describe"} and loop_thread not in threads.values()
    assert app.services.bodies.offloaded == 3  # read_request, CaptureCore.describe, the upstream encode


async def test_a_small_body_is_prepared_on_the_loop_without_a_thread_hop(rig, monkeypatch):
    http, app, engine = rig
    engine.answers.append(vllm_chat_response([1, 2], [3]))
    chat = app.adapters["chat"]
    parse, threads = chat.parse, []
    monkeypatch.setattr(chat, "parse", lambda body, **route: threads.append(threading.get_ident()) or parse(body, **route))
    response = await http.post(CHAT.format("r-small"), content=chat_body(conversation(turns=2, size=100)))
    assert response.status_code == 200, response.text
    assert threads == [threading.get_ident()]
    assert app.services.bodies.offloaded == 0


async def _two_calls(http, engine, rollout: str) -> tuple[list[httpx.Response], int]:
    """A large call and the call continuing it (its parent resolved against the lineage index)."""
    first = conversation()
    engine.answers += [vllm_chat_response([1, 2, 3], [4, 5], text="done"),
                       vllm_chat_response([1, 2, 3, 4, 5, 6], [7], text="bye")]
    sent = len(engine.sent)
    one = await http.post(CHAT.format(rollout), content=chat_body(first))
    follow = [*first, {"role": "assistant", "content": "done"}, {"role": "user", "content": "thanks"}]
    two = await http.post(CHAT.format(rollout), content=chat_body(follow))
    return [one, two], sent


def _comparable(captured: CallCaptured) -> dict[str, Any]:
    """A capture without what names the call itself (its id, time, parent's id, response id)."""
    fields = dataclasses.asdict(captured)
    for name in ("model_call_id", "created_at", "parent_call_id"):
        fields.pop(name)
    fields["facts"].pop("response_id")
    return fields


async def test_a_large_body_gets_what_the_loop_path_gives_it(rig, publisher, monkeypatch):
    http, app, engine = rig
    monkeypatch.setattr(generation, "LARGE_BODY_BYTES", 1 << 30)  # every body on the loop's path
    inline, inline_from = await _two_calls(http, engine, "r-inline")
    assert app.services.bodies.offloaded == 0
    monkeypatch.setattr(generation, "LARGE_BODY_BYTES", LARGE_BODY_BYTES)
    lane, lane_from = await _two_calls(http, engine, "r-lane")
    assert app.services.bodies.offloaded == 6  # three steps a call

    assert [r.status_code for r in inline + lane] == [200] * 4
    for a, b in zip(inline, lane, strict=True):
        assert {**a.json(), "id": ""} == {**b.json(), "id": ""}
    assert engine.sent[inline_from:lane_from] == engine.sent[lane_from:]  # the same bytes upstream
    captured = [e.body for e in publisher.events]
    assert [type(c) for c in captured] == [CallCaptured] * 4
    assert [_comparable(c) for c in captured[:2]] == [_comparable(c) for c in captured[2:]]
    # The second call continued the first on both paths (the lineage index read the digests hashed off the loop).
    assert captured[1].parent_call_id == captured[0].model_call_id
    assert captured[3].parent_call_id == captured[2].model_call_id
    assert captured[3].parent_resolution is ParentResolution.RESOLVED and captured[3].prompt_is_delta


def _too_deep(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = [value]
    return value


BAD = {
    "not JSON": b'{"model": "policy", "messages": [' + b" " * (LARGE_BODY_BYTES + 1),
    "not an object": json.dumps(["x" * (LARGE_BODY_BYTES + 1)]).encode(),
    "a message without a role": chat_body([*conversation(), {"content": "who?"}]),
    "nested too deep": chat_body([*conversation(), {"role": "user", "content": "x", "extra": _too_deep(300)}]),
}


@pytest.mark.parametrize("body", list(BAD.values()), ids=list(BAD))
async def test_a_bad_large_body_gets_the_loop_paths_error(rig, publisher, monkeypatch, body):
    http, app, engine = rig
    assert len(body) > LARGE_BODY_BYTES
    monkeypatch.setattr(generation, "LARGE_BODY_BYTES", 1 << 30)
    inline = await http.post(CHAT.format("r-bad"), content=body)
    monkeypatch.setattr(generation, "LARGE_BODY_BYTES", LARGE_BODY_BYTES)
    lane = await http.post(CHAT.format("r-bad"), content=body)
    assert inline.status_code == lane.status_code == 400
    assert inline.json() == lane.json()
    assert app.services.bodies.offloaded == 1  # refused by read_request: nothing described
    assert publisher.all == [] and engine.sent == []


async def test_a_step_waiting_for_the_lane_is_never_run_once_cancelled():
    """Waiting steps queue on the lane; one whose request went away before its turn never runs."""
    bodies = LargeBodies(workers=1)
    gate, ran = threading.Event(), []
    holding = asyncio.ensure_future(bodies.offload(gate.wait, BLOCKED_FOR_S))
    waiting = asyncio.ensure_future(bodies.offload(ran.append, "ran"))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting  # its request went away while the lane was busy
    gate.set()
    assert await holding is True
    await bodies.offload(ran.append, "after")  # the lane's thread has run everything submitted before this
    assert ran == ["after"]
    await bodies.close()


async def test_memory_is_released_once_the_last_large_call_ended(rig):
    http, app, engine = rig
    engine.answers += [vllm_chat_response([1, 2], [3]), vllm_chat_response([1, 2], [3])]
    await http.post(CHAT.format("r-small"), content=chat_body(conversation(turns=2, size=100)))
    await asyncio.sleep(0)
    assert app.services.bodies.releases == 0  # small calls never
    await asyncio.gather(*(http.post(CHAT.format(f"r-{i}"), content=chat_body(conversation())) for i in range(2)))
    await asyncio.sleep(0)  # the release runs from the loop's next callback on, once the handlers' frames are gone
    assert app.services.bodies.releases == 1  # once, when the last of the two ended


async def test_a_large_body_is_parsed_in_steps_from_the_very_bytes_the_server_handed_over(rig, monkeypatch):
    from tests.unit.producers import raw_asgi

    _, app, engine = rig
    engine.answers.append(vllm_chat_response([1, 2], [3]))
    seen: list[bytes] = []
    stepped = generation.load_json_in_steps
    monkeypatch.setattr(generation, "load_json_in_steps", lambda raw, what: seen.append(raw) or stepped(raw, what))
    body = chat_body(conversation())
    response = await raw_asgi.call(app, "POST", CHAT.format("r-steps").encode(), body=body)
    assert response.status == 200, response.body
    # No copy of it on the loop on the way (admission reads it; the handler gets those bytes), and one parse.
    assert len(seen) == 1 and seen[0] is body


async def test_the_proxys_lifespan_freezes_its_startup_heap(publisher):
    import gc

    settings = InterceptorSettings(upstream_url="http://engine", bootstrap="unused:9092", control_token="s3cret")
    upstream = httpx.AsyncClient(base_url="http://engine", transport=httpx.MockTransport(Engine().handler))
    app = Interceptor(settings, publisher=publisher, upstream=upstream)  # type: ignore[arg-type]
    messages = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])
    sent: list[str] = []
    frozen_before = gc.get_freeze_count()

    async def receive() -> dict[str, Any]:
        return next(messages)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message["type"])
        if message["type"] == "lifespan.startup.complete":
            frozen.append(gc.get_freeze_count())

    frozen: list[int] = []
    try:
        await app({"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send)
    finally:
        gc.unfreeze()  # the rest of the test session's objects stay the collector's
        await upstream.aclose()
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    # A full collection (LargeBodies.release_memory's) then walks only what calls made after startup.
    assert frozen[0] > frozen_before and frozen[0] > 10_000
