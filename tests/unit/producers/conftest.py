"""Interceptor unit fixtures: a recording publisher and a scripted vLLM-shaped upstream (no broker)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from producers.http.app import Interceptor
from producers.settings import InterceptorSettings
from schemas.codec import decode_event
from schemas.kafka.bridge import PublishFailed
from schemas.records import CallCaptured, CallStarted


class RecordingPublisher:
    """Stands in for the AckedProducer the interceptor publishes with: records events; can be told to fail or to hold acks.

    ``all`` is every event in publish order; ``events`` leaves out the CallStarted intent each
    captured call publishes before dispatch (``intents``), so a test of what a call recorded reads
    its one record; ``tests/unit/producers/test_engine_stalls.py`` tests the intents themselves.
    """

    def __init__(self) -> None:
        self.all: list[Any] = []
        self.events: list[Any] = []
        self.intents: list[Any] = []
        self.raw: list[tuple[str, bytes, bytes]] = []
        self.fail = False
        self.possibly_persisted = False
        self.gate: asyncio.Event | None = None

    async def produce(self, topic: str, key: bytes, value: bytes) -> tuple[int, int]:
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise PublishFailed("broker down", possibly_persisted=self.possibly_persisted)
        self.raw.append((topic, key, value))
        event = decode_event(value)
        self.all.append(event)
        (self.intents if isinstance(event.body, CallStarted) else self.events).append(event)
        return 0, len(self.all) - 1

    async def close(self) -> int:
        return 0


def vllm_chat_response(prompt_ids, gen_ids, text="hi", tool_calls=None, *, token_ids=True, model="policy"):
    message = {"role": "assistant", "content": text, "reasoning": None, "refusal": None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    choice = {
        "index": 0,
        "message": message,
        "logprobs": {"content": [{"token": f"t{t}", "logprob": -0.25 * (i + 1), "bytes": [], "top_logprobs": []}
                                 for i, t in enumerate(gen_ids)]} if token_ids else None,
        "finish_reason": "tool_calls" if tool_calls else "stop",
        "stop_reason": None,
    }
    body = {"id": "chatcmpl-upstream", "object": "chat.completion", "created": 0, "model": model,
            "choices": [choice], "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(gen_ids)}}
    if token_ids:
        choice["token_ids"] = gen_ids
        body["prompt_token_ids"] = prompt_ids
    return body


class ScriptedUpstream:
    """Answers scripted responses in order. GET /v1/models (the interceptor's model discovery) is
    answered from ``models`` and recorded in ``model_requests``, apart from the scripted calls."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.responses: list[httpx.Response] = []
        self.models: httpx.Response | None = None  # None: {"data": [{"id": "policy", "max_model_len": 32768}]}
        self.model_requests: list[dict[str, Any]] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        entry = {"path": request.url.path, "body": json.loads(request.content or b"null"),
                 "headers": dict(request.headers)}
        if request.method == "GET" and request.url.path == "/v1/models":
            self.model_requests.append(entry)
            if self.models is not None:
                return self.models
            return httpx.Response(200, json={"object": "list", "data": [
                {"id": "policy", "object": "model", "max_model_len": 32768}]})
        self.requests.append(entry)
        if self.responses:
            return self.responses.pop(0)
        return httpx.Response(200, json={"object": "list", "data": [{"id": "policy"}]})


@pytest.fixture
def publisher():
    return RecordingPublisher()


@pytest.fixture
def upstream():
    return ScriptedUpstream()


@pytest.fixture
async def interceptor(publisher, upstream):
    settings = InterceptorSettings(upstream_url="http://engine", bootstrap="unused:9092", control_token="s3cret",
                                   sampling_overrides={"temperature": 1.0})
    client = httpx.AsyncClient(base_url="http://engine", transport=httpx.MockTransport(upstream.handler))
    app = Interceptor(settings, publisher=publisher, upstream=client)  # type: ignore[arg-type]
    await app.startup()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://tt") as http:
        yield http
    await client.aclose()


@pytest.fixture
async def app(publisher, upstream):
    """The bare interceptor ASGI app (no sampling pin) over the scripted upstream, for raw-scope tests."""
    settings = InterceptorSettings(upstream_url="http://engine", bootstrap="unused:9092", control_token="s3cret")
    client = httpx.AsyncClient(base_url="http://engine", transport=httpx.MockTransport(upstream.handler))
    interceptor = Interceptor(settings, publisher=publisher, upstream=client)  # type: ignore[arg-type]
    await interceptor.startup()
    yield interceptor
    await interceptor.shutdown()


@pytest.fixture
async def policy_app(publisher):
    """The bare interceptor ASGI app over the in-process reference policy server, serving
    ``tokentrail-policy`` whatever model a client names: the real SDKs of every dialect run
    multi-turn sessions through it."""
    from compose.engines.policy import create_app

    upstream = httpx.AsyncClient(base_url="http://policy", transport=httpx.ASGITransport(app=create_app()))
    interceptor = Interceptor(InterceptorSettings(upstream_url="http://policy", bootstrap="unused:1",
                                                  upstream_model="tokentrail-policy"),
                              publisher=publisher, upstream=upstream)  # type: ignore[arg-type]
    await interceptor.startup()
    yield interceptor
    await interceptor.shutdown()


def captured(publisher: RecordingPublisher) -> list[CallCaptured]:
    """The CallCaptured bodies ``publisher`` recorded, in publish order."""
    return [e.body for e in publisher.events if isinstance(e.body, CallCaptured)]


@pytest.fixture
async def make_interceptor(publisher, tmp_path):
    """An interceptor in front of the in-process reference policy server; settings overridable."""
    from compose.engines.policy import create_app

    clients = []

    async def make(policy_settings: dict | None = None, **overrides):
        policy = create_app(**(policy_settings or {}))
        upstream = httpx.AsyncClient(base_url="http://policy",
                                     transport=httpx.ASGITransport(app=policy, raise_app_exceptions=False))
        settings = InterceptorSettings(**{"upstream_url": "http://policy", "bootstrap": "unused:9092",
                                          "control_token": "s3cret", **overrides})
        app = Interceptor(settings, publisher=publisher, upstream=upstream)  # type: ignore[arg-type]
        await app.startup()
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://tt", timeout=30)
        clients.append((http, app))
        return http, app

    yield make
    for http, app in clients:
        await http.aclose()
        await app.shutdown()


@pytest.fixture
async def policy_rig(publisher):
    """``make(policy=None, **settings) -> (harness client, engine client)``: an interceptor over the in-process
    reference policy server (4 ms a token; ``policy`` overrides its settings), the engine warmed up (its first
    generation builds its tables: a pause must find tokens generated)."""
    from compose.engines.policy import create_app

    made = []

    async def make(policy: dict | None = None, **overrides):
        engine = httpx.AsyncClient(base_url="http://policy", timeout=30, transport=httpx.ASGITransport(
            app=create_app(**{"decode_ms_per_token": 4, **(policy or {})}), raise_app_exceptions=False))
        settings = InterceptorSettings(**{"upstream_url": "http://policy", "bootstrap": "unused:9092",
                                          "control_token": "s3cret", **overrides})
        app = Interceptor(settings, publisher=publisher, upstream=engine)  # type: ignore[arg-type]
        await app.startup()
        warm = await engine.post("/v1/chat/completions", json={
            "model": "tokentrail-policy", "messages": [{"role": "user", "content": "go"}], "max_tokens": 2})
        assert warm.status_code == 200
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://tt", timeout=60)
        made.append((http, app, engine))
        return http, engine

    yield make
    for http, app, engine in made:
        await http.aclose()
        await app.shutdown()
        await engine.aclose()


@pytest.fixture
async def over_engine(publisher):
    """An interceptor in front of a ``FakeVLLM`` (tests.unit.producers.fake_vllm); settings overridable."""
    made = []

    async def make(engine, **overrides):
        settings = InterceptorSettings(**{"upstream_url": "http://engine", "bootstrap": "unused:9092",
                                          "control_token": "s3cret", **overrides})
        app = Interceptor(settings, publisher=publisher, upstream=engine.client())  # type: ignore[arg-type]
        await app.startup()
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://tt", timeout=30)
        made.append((http, app))
        return http, app

    yield make
    for http, app in made:
        await http.aclose()
        await app.shutdown()
