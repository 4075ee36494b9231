"""The vLLM middleware entry point: same capture core, in-process upstream, true streaming."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from compose.policy import create_app
from producers.middleware import StreamingASGITransport, TokentrailMiddleware, settings_from_env
from producers.settings import InterceptorSettings
from schemas.errors import ConfigError
from schemas.records import CallCaptured

SETTINGS = InterceptorSettings(upstream_url="http://in-process", bootstrap="unused:9092")


def test_settings_come_from_the_environment_and_are_validated():
    with pytest.raises(ConfigError, match="TOKENTRAIL_BOOTSTRAP"):
        settings_from_env({})
    with pytest.raises(ConfigError, match="sampling"):
        settings_from_env({"TOKENTRAIL_BOOTSTRAP": "k:9092", "TOKENTRAIL_SAMPLING": '{"temprature": 1}'})
    s = settings_from_env({"TOKENTRAIL_BOOTSTRAP": "k:9092", "TOKENTRAIL_TOPIC_PREFIX": "x.",
                           "TOKENTRAIL_PREFIX_SUPPLY": "1"})
    assert s.topics.rollout_events == "x.tokentrail.rollout-events" and s.prefix_supply


async def test_wrapped_policy_server_serves_bare_routes_and_captures_prefixed_ones(publisher):
    app = TokentrailMiddleware(create_app(), settings=SETTINGS, publisher=publisher)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://vllm") as http:
        assert (await http.get("/v1/models")).status_code == 200
        plain = await http.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "x"}],
                                                              "return_token_ids": True})
        assert "prompt_token_ids" in plain.json() and publisher.events == []  # untouched vLLM behaviour
        r = await http.post("/ng-rollout/mw-1/training-token-capture/v1/chat/completions",
                            json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 200 and "prompt_token_ids" not in r.json()
        (event,) = publisher.events
        assert isinstance(event.body, CallCaptured) and event.rollout_id == "mw-1"
        metrics = await http.get("/tokentrail/metrics")
        assert b"tokentrail_calls_captured_total 1.0" in metrics.content
    await app.interceptor.shutdown()


def _gated_engine(gate: asyncio.Event):
    """A stand-in vLLM: streams one chunk, waits for the gate, then finishes."""

    def chunk(**choice):
        return b"data: " + json.dumps({"id": "x", "object": "chat.completion.chunk", "model": "m",
                                        "choices": [{"index": 0, **choice}]}).encode() + b"\n\n"

    async def app(scope, receive, send):
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        first = json.loads(chunk(delta={"role": "assistant", "content": ""})[6:])
        first["prompt_token_ids"] = [1, 2]
        await send({"type": "http.response.body", "body": b"data: " + json.dumps(first).encode() + b"\n\n",
                    "more_body": True})
        await send({"type": "http.response.body", "more_body": True, "body": chunk(
            delta={"content": "he"}, token_ids=[5], logprobs={"content": [{"token": "he", "logprob": -0.5}]})})
        await gate.wait()
        await send({"type": "http.response.body", "more_body": True, "body": chunk(
            delta={"content": "llo"}, token_ids=[6], logprobs={"content": [{"token": "llo", "logprob": -0.25}]},
            finish_reason="stop")})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})

    return app


async def test_chunks_reach_the_client_before_the_engine_finishes(publisher):
    gate = asyncio.Event()
    app = TokentrailMiddleware(_gated_engine(gate), settings=SETTINGS, publisher=publisher)
    async with httpx.AsyncClient(transport=StreamingASGITransport(app), base_url="http://vllm") as http:
        async with http.stream("POST", "/ng-rollout/mw-2/training-token-capture/v1/chat/completions",
                               json={"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}) as r:
            lines = r.aiter_lines()
            seen = []
            async for line in lines:
                if line.startswith("data:"):
                    seen.append(line)
                if '"he"' in line:
                    break
            assert publisher.events == [], "mid-stream: nothing captured yet, yet the client has the text"
            gate.set()
            rest = [line async for line in lines if line.startswith("data:")]
    assert rest[-1] == "data: [DONE]"
    (event,) = publisher.events
    assert event.body.generation_token_ids == [5, 6] and event.body.generation_log_probs == [-0.5, -0.25]
    await app.interceptor.shutdown()
