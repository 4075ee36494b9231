"""Dialect-test fixtures: a bridge app that plays the interceptor's translation path.

harness SDK -> bridge (``to_chat_request`` + the capture fields) -> reference policy server
(in-process) -> ``from_chat_response`` / ``StreamTranslator`` -> harness SDK. Every call is
recorded with the ids the engine reported, so tests can check the token chain.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx
import httpx2
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from compose.engines.policy import PolicySettings, create_app
from compose.engines.policy.testkit import parse_sse
from producers.dialects import anthropic as adialect
from producers.dialects import responses as rdialect
from producers.dialects.common import DialectError

TOKEN_KEYS = ("prompt_token_ids", "token_ids", "prompt_logprobs")


@dataclass
class Call:
    dialect: str
    body: dict
    chat_request: dict
    stream: bool
    prompt_ids: list[int]
    gen_ids: list[int]
    upstream: Any  # the chat completion (dict) or the list of chunks
    emitted: list[Any] = field(default_factory=list)  # what the harness received (JSON values)


class Bridge:
    def __init__(self, **settings: Any) -> None:
        policy_settings = PolicySettings(**settings)
        self.served_model = policy_settings.served_model_name
        self.policy_app = create_app(policy_settings)
        self.policy = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.policy_app), base_url="http://policy")
        self.calls: list[Call] = []
        self.app = Starlette(routes=[
            Route("/v1/messages", self._messages, methods=["POST"]),
            Route("/v1/responses", self._responses, methods=["POST"]),
        ])

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app))

    def client2(self) -> httpx2.AsyncClient:
        """The anthropic SDK runs on httpx2 and refuses httpx objects."""
        return httpx2.AsyncClient(transport=httpx2.ASGITransport(app=self.app))

    async def _messages(self, request: Request) -> Response:
        return await self._serve(request, "anthropic")

    async def _responses(self, request: Request) -> Response:
        return await self._serve(request, "responses")

    async def _serve(self, request: Request, dialect: str) -> Response:
        body = await request.json()
        mod = adialect if dialect == "anthropic" else rdialect
        extra: dict[str, Any] = {"request": body} if dialect == "responses" else {}
        try:
            chat = mod.to_chat_request(body)
        except DialectError as exc:
            return JSONResponse({"type": "error", "error": {"type": "invalid_request_error", "message": str(exc)}},
                                400)
        # As the interceptor sends it: the model the engine serves, and the capture fields.
        upstream_body = {**chat, "model": self.served_model, "return_token_ids": True, "logprobs": True}
        upstream = await self.policy.post("/v1/chat/completions", json=upstream_body)
        assert upstream.status_code == 200, upstream.text
        response_id = f"{'msg' if dialect == 'anthropic' else 'resp'}_call{len(self.calls)}"
        model = body.get("model", "")
        if chat.get("stream"):
            chunks = parse_sse(upstream.text)
            translator = (adialect.StreamTranslator(response_id, model) if dialect == "anthropic"
                          else rdialect.StreamTranslator(response_id, model, body))
            events = [event for chunk in chunks for event in translator.feed(chunk)]
            assert all(name not in ("message_stop", "response.completed", "response.incomplete") for name, _ in events)
            rest, terminal = translator.finish()
            events += rest + [terminal]
            gen = [t for c in chunks for ch in c["choices"] for t in ch.get("token_ids") or []]
            call = Call(dialect, body, chat, True, chunks[0]["prompt_token_ids"], gen, chunks,
                        [data for _, data in events])
            self.calls.append(call)
            payload = b"".join(mod.encode_sse(name, data) for name, data in events)
            return Response(payload, media_type="text/event-stream")
        data = upstream.json()
        out = mod.from_chat_response(data, response_id=response_id, model=model, **extra)
        self.calls.append(Call(dialect, body, chat, False, data["prompt_token_ids"],
                               data["choices"][0]["token_ids"], data, [out]))
        return JSONResponse(out)

    def assert_chain(self) -> None:
        """Each call's prompt starts with the previous call's prompt + generated ids."""
        for before, after in zip(self.calls, self.calls[1:]):
            expected = before.prompt_ids + before.gen_ids
            assert after.prompt_ids[: len(expected)] == expected, "the token chain broke across the echo"
            assert len(after.prompt_ids) > len(expected)

    def assert_no_token_fields(self) -> None:
        for call in self.calls:
            for value in call.emitted:
                assert_clean(value)


def assert_clean(value: Any) -> None:
    """No token field anywhere; ``logprobs`` only as the empty list the SDKs require."""
    if isinstance(value, dict):
        for key, inner in value.items():
            assert key not in TOKEN_KEYS, f"token field {key!r} emitted"
            if key == "logprobs":
                assert inner == [], f"log-probs emitted: {inner!r}"
            assert_clean(inner)
    elif isinstance(value, list):
        for inner in value:
            assert_clean(inner)


@pytest.fixture
async def make_bridge():
    bridges: list[Bridge] = []

    def factory(**settings: Any) -> Bridge:
        bridge = Bridge(**settings)
        bridges.append(bridge)
        return bridge

    yield factory
    for bridge in bridges:
        await bridge.policy.aclose()

