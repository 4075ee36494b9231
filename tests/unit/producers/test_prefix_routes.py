"""Which engine route a supplied prompt takes, through the interceptor over the stand-in engine, in process.

On the 0.34 stand-in a streamed call whose ids are supplied goes render -> /inference/v1/generate
(stream, derender), records ``prefix_route`` "/inference/v1/generate", and captures exactly the ids and
log-probs the engine streamed (its prompt the supplied ids); the harness's dialect (chat, Anthropic,
Responses) works unchanged on top. A non-streamed call stays on the chat route. On the 0.33 stand-in
(whose render has no parse_context and which refuses a streamed derender, as 0.33 did) the startup
probe says no and every supplied call goes
the 0.32 way (kv_transfer_params on the chat route). A generate stream without token ids masks the call.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from compose.engines.policy import create_app
from producers.http.app import Interceptor
from producers.settings import InterceptorSettings
from schemas.records import CallCaptured, CallIncomplete, IncompleteReason, PrefixRoute
from tests.unit.producers.conftest import RecordingPublisher

BASE = "/ng-rollout/{rid}/training-token-capture"
TOOL = {"type": "function", "function": {"name": "Bash", "description": "Run a shell command", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
SYSTEM = "You are an agent. #tool-calls=2"


class Recorder(httpx.AsyncBaseTransport):
    """The stand-in in process; keeps each request's path and body and each streamed answer's events."""

    def __init__(self, release: str) -> None:
        self.inner = httpx.ASGITransport(app=create_app(vllm_release=release))
        self.seen: list[tuple[str, Any, list[dict]]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(await request.aread() or b"null")
        response = await self.inner.handle_async_request(request)
        content = await response.aread()
        events = [json.loads(line[6:]) for line in content.decode().splitlines() if line.startswith("data: {")]
        self.seen.append((request.url.path, body, events))
        return httpx.Response(response.status_code, headers=response.headers, content=content)

    def paths(self) -> list[str]:
        return [p for p, _, _ in self.seen]


async def _rig(release: str):
    engine = Recorder(release)
    publisher = RecordingPublisher()
    upstream = httpx.AsyncClient(base_url="http://policy", transport=engine, timeout=30)
    settings = InterceptorSettings(upstream_url="http://policy", bootstrap="unused:9092", control_token="s3cret",
                                   prefix_supply=True, upstream_model="tokentrail-policy")
    app = Interceptor(settings, publisher=publisher, upstream=upstream)  # type: ignore[arg-type]
    await app.startup()
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://tt", timeout=30)
    return engine, publisher, app, client, upstream


@pytest.fixture
async def rig(request):
    engine, publisher, app, client, upstream = await _rig(request.param)
    yield engine, publisher, client
    await client.aclose()
    await app.shutdown()
    await upstream.aclose()


def _sse(r: httpx.Response) -> list[dict]:
    return [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]


async def _chat_rollout(client: httpx.AsyncClient, rid: str, *, stream: bool, turns: int = 3,
                        last: str = "") -> list[httpx.Response]:
    messages: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "List the files."}]
    answers = []
    for turn in range(turns):
        if last and turn == turns - 1:
            messages[-1] = {**messages[-1], "content": messages[-1]["content"] + last}
        r = await client.post(BASE.format(rid=rid) + "/v1/chat/completions", json={
            "model": "any", "messages": messages, "tools": [TOOL], "max_tokens": 200, "stream": stream})
        answers.append(r)
        if r.status_code != 200:
            return answers
        if stream:
            calls: dict[int, dict] = {}
            content = ""
            for chunk in _sse(r):
                for choice in chunk.get("choices") or ():
                    content += choice["delta"].get("content") or ""
                    for d in choice["delta"].get("tool_calls") or ():
                        call = calls.setdefault(d["index"], {"id": "", "type": "function",
                                                             "function": {"name": "", "arguments": ""}})
                        call["id"] += d.get("id") or ""
                        call["function"]["name"] += (d.get("function") or {}).get("name") or ""
                        call["function"]["arguments"] += (d.get("function") or {}).get("arguments") or ""
            message: dict = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = [calls[i] for i in sorted(calls)]
        else:
            message = {k: v for k, v in r.json()["choices"][0]["message"].items() if v is not None}
        messages.append(message)
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": "a.txt"} for c in message.get("tool_calls", ())]
        if not message.get("tool_calls"):
            messages.append({"role": "user", "content": "go on"})
    return answers


def _captured(publisher: RecordingPublisher) -> list[CallCaptured]:
    return [e.body for e in publisher.events if isinstance(e.body, CallCaptured)]


def _streamed_tokens(events: list[dict]) -> tuple[list[int], list[float], list[int] | None]:
    ids = [t for e in events for c in e.get("choices") or () for t in c.get("token_ids") or ()]
    lps = [x["logprob"] for e in events for c in e.get("choices") or () for x in (c.get("logprobs") or {}).get("content") or ()]
    prompt = next((e["prompt_token_ids"] for e in events if "prompt_token_ids" in e), None)
    return ids, lps, prompt


@pytest.mark.parametrize("rig", ["0.34"], indirect=True)
async def test_on_0_34_a_streamed_supplied_call_goes_the_generate_route_token_exact(rig):
    engine, publisher, client = rig
    answers = await _chat_rollout(client, "gen-34", stream=True)
    assert all(r.status_code == 200 for r in answers)
    calls = _captured(publisher)
    assert len(calls) == 3
    generated = [(body, events) for path, body, events in engine.seen
                 if path == "/inference/v1/generate"][1:]  # [0]: the startup probe
    assert len(generated) == 2  # turns 2 and 3: their ids supplied
    harness = [body for path, body, _ in engine.seen if path == "/v1/chat/completions" and "tools" in body]
    assert len(harness) == 1 and not harness[0].get("kv_transfer_params")  # only the first turn went that way
    assert calls[0].prefix_route == "" and not calls[0].prefix_supplied
    for call, (body, events) in zip(calls[1:], generated):
        assert call.prefix_requested and call.prefix_supplied and call.prefix_route == PrefixRoute.GENERATE
        ids, lps, prompt = _streamed_tokens(events)
        assert prompt == body["token_ids"]  # the engine reports the supplied ids as its prompt
        assert call.generation_token_ids == ids and [x.hex() for x in call.generation_log_probs] == [x.hex() for x in lps]
        parent = calls[calls.index(call) - 1]
        full_prompt = parent.prompt_token_ids if not parent.prompt_is_delta else None
        assert call.prompt_is_delta and call.cum_len == len(body["token_ids"]) + len(ids)
        if full_prompt is not None:  # the supplied ids continue the parent's exactly
            assert body["token_ids"][: parent.cum_len] == full_prompt + parent.generation_token_ids
    # The harness saw no token fields and the tool calls it needed to go on.
    text = answers[1].text
    assert "token_ids" not in text and "prompt_token_ids" not in text and "tool_calls" in text


@pytest.mark.parametrize("rig", ["0.34"], indirect=True)
async def test_on_0_34_a_non_streamed_supplied_call_stays_on_the_chat_route(rig):
    engine, publisher, client = rig
    await _chat_rollout(client, "chat-34", stream=False)
    calls = _captured(publisher)
    assert [c.prefix_route for c in calls] == ["", PrefixRoute.CHAT, PrefixRoute.CHAT]
    assert engine.paths().count("/inference/v1/generate") == 1  # the startup probe only


@pytest.mark.parametrize("rig", ["0.33"], indirect=True)
async def test_on_0_33_streamed_supplied_calls_go_the_0_32_way(rig):
    engine, publisher, client = rig
    answers = await _chat_rollout(client, "gen-33", stream=True)
    assert all(r.status_code == 200 for r in answers)
    calls = _captured(publisher)
    assert [c.prefix_route for c in calls] == ["", PrefixRoute.CHAT, PrefixRoute.CHAT]
    assert all(c.prefix_supplied for c in calls[1:])
    # The startup probe stopped at the render: 0.33's answer has no parse_context (a derendering generate's
    # input), so not even the probe sent a generate request, and no call tried the route.
    assert "/inference/v1/generate" not in engine.paths()
    supplied = [b for p, b, _ in engine.seen if p == "/v1/chat/completions" and (b.get("kv_transfer_params") or {})]
    assert len(supplied) >= 2


@pytest.mark.parametrize("rig", ["0.34"], indirect=True)
@pytest.mark.parametrize("path,body", [
    ("/v1/messages", {"model": "claude-x", "max_tokens": 200, "system": SYSTEM, "tools": [
        {"name": "Bash", "description": "Run", "input_schema": TOOL["function"]["parameters"]}]}),
    ("/v1/responses", {"model": "gpt-x", "instructions": SYSTEM, "max_output_tokens": 200, "tools": [
        {"type": "function", "name": "Bash", "description": "Run", "parameters": TOOL["function"]["parameters"]}]}),
])
async def test_every_dialect_streams_on_top_of_the_generate_route(rig, path, body):
    engine, publisher, client = rig
    rid = f"dialect-{path.rsplit('/', 1)[-1]}"
    first = await client.post(BASE.format(rid=rid) + path, json={
        **body, **({"messages": [{"role": "user", "content": "List."}]} if "messages" in path else
                   {"input": [{"role": "user", "content": "List."}]})})
    assert first.status_code == 200, first.text
    if path == "/v1/messages":
        content = first.json()["content"]
        follow = {"messages": [{"role": "user", "content": "List."}, {"role": "assistant", "content": content},
                               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": b["id"],
                                                             "content": "a.txt"} for b in content
                                                            if b["type"] == "tool_use"]}]}
    else:
        output = first.json()["output"]
        follow = {"input": [{"role": "user", "content": "List."}, *output,
                            *({"type": "function_call_output", "call_id": o["call_id"], "output": "a.txt"}
                              for o in output if o["type"] == "function_call")]}
    r = await client.post(BASE.format(rid=rid) + path, json={**body, **follow, "stream": True})
    assert r.status_code == 200 and ("message_stop" in r.text or "response.completed" in r.text), r.text[-400:]
    child = _captured(publisher)[-1]
    assert child.prefix_route == PrefixRoute.GENERATE and child.facts.streamed
    _, _, events = [s for s in engine.seen if s[0] == "/inference/v1/generate"][-1]
    assert child.generation_token_ids == _streamed_tokens(events)[0]


@pytest.mark.parametrize("rig", ["0.34"], indirect=True)
async def test_a_generate_stream_without_token_ids_masks_the_call(rig):
    engine, publisher, client = rig
    answers = await _chat_rollout(client, "noids-34", stream=True, turns=2, last=" [[fault:no_token_ids]]")
    assert answers[-1].status_code == 200 and "error" in answers[-1].text  # an error event, not [DONE]
    marker = [e.body for e in publisher.events if isinstance(e.body, CallIncomplete)][-1]
    assert marker.reason == IncompleteReason.PARTIAL_TOKEN_METADATA and "token_ids" in marker.detail
    assert len(_captured(publisher)) == 1  # the first turn only
