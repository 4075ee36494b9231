"""tokentrail against vLLM 0.34, the production target, without vLLM: the checked-in description of its models
(compose/engines/vllm_contract/vllm-0.34.0.json, generated from the 0.34.0 wheel) pins

(a) every request the interceptor sends the engine: the chat body of each dialect (chat, Anthropic
    Messages, Responses; streaming and not, with the capture's fields: return_token_ids, logprobs,
    top_logprobs, include_reasoning, return_weight_versions), the prefix-supply render bodies and
    kv_transfer_params, the GenerateRequest of streamed calls' supplied ids (/inference/v1/generate,
    stream and derender), and the startup probes: each key a field of 0.34's request model, of a type it takes;
(b) every answer of the stand-in engine (JSON, stream chunks, usage chunk, render, tokenize, the
    derendered generate stream, errors, checkpoint state) to 0.34's response models as 0.34 serialises them (keys it omits instead of null
    are omitted);

and shows the check can fail: a field renamed in a copy of the description, a null 0.34 leaves out, a
0.33-shaped answer. The live tests pin the stand-in to the 0.32 CPU build
(tests/integration/compose/engines/test_engine_contract.py); this one needs no engine.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from compose.engines.policy import create_app
from compose.engines.vllm_contract import PRODUCTION, load
from compose.engines.vllm_contract.check import Contract
from producers.http.app import Interceptor
from producers.settings import InterceptorSettings
from schemas.codec import decode_event
from schemas.records import CallCaptured

DESCRIPTION = load()
CONTRACT = Contract(DESCRIPTION)
TOOL = {"type": "function", "function": {"name": "Bash", "description": "Run a shell command", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
BASH = {"name": "Bash", "description": "Run a shell command", "input_schema": TOOL["function"]["parameters"]}
RESP_BASH = {"type": "function", "name": "Bash", "description": "Run a shell command",
             "parameters": TOOL["function"]["parameters"]}
SYSTEM = "You are an agent. #tool-calls=1"
BASE = "/ng-rollout/{rid}/training-token-capture"


class Publisher:
    """Stands in for the interceptor's Kafka producer: keeps the decoded events."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    async def produce(self, topic: str, key: bytes, value: bytes) -> tuple[int, int]:
        self.events.append(decode_event(value))
        return 0, len(self.events) - 1

    async def close(self) -> int:
        return 0


@pytest.fixture
def publisher() -> Publisher:
    return Publisher()


@dataclass
class Exchange:
    path: str
    request: Any
    status: int
    answer: Any = None  # JSON, or the list of SSE data values
    stream: bool = False


@dataclass
class RecordingEngine(httpx.AsyncBaseTransport):
    """The stand-in in process, every request and answer recorded as the interceptor sent and read it."""

    release: str = "0.34"
    exchanges: list[Exchange] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.inner = httpx.ASGITransport(app=create_app(vllm_release=self.release), raise_app_exceptions=False)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(await request.aread() or b"null")
        response = await self.inner.handle_async_request(request)
        content = await response.aread()
        stream = response.headers.get("content-type", "").startswith("text/event-stream")
        answer = [json.loads(line[6:]) for line in content.decode().splitlines()
                  if line.startswith("data: {")] if stream else json.loads(content or b"null")
        self.exchanges.append(Exchange(request.url.path, body, response.status_code, answer, stream))
        return httpx.Response(response.status_code, headers=response.headers, content=content)


async def _conversation(release: str, publisher) -> RecordingEngine:
    """Two tool-using turns in each dialect, streaming and not, through an interceptor with prefix supply."""
    engine = RecordingEngine(release)
    upstream = httpx.AsyncClient(base_url="http://policy", transport=engine, timeout=30)
    settings = InterceptorSettings(upstream_url="http://policy", bootstrap="unused:9092", control_token="s3cret",
                                   prefix_supply=True, upstream_model="tokentrail-policy")
    app = Interceptor(settings, publisher=publisher, upstream=upstream)  # type: ignore[arg-type]
    await app.startup()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://tt", timeout=30) as tt:
            for stream in (False, True):
                await _chat(tt, f"chat-{stream}", stream)
                await _anthropic(tt, f"anth-{stream}", stream)
                await _responses(tt, f"resp-{stream}", stream)
    finally:
        await app.shutdown()
        await upstream.aclose()
    return engine


def _events(response: httpx.Response) -> list[Any]:
    return [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]


async def _chat(tt: httpx.AsyncClient, rid: str, stream: bool) -> None:
    messages: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "List the files."}]
    for _ in range(2):
        r = await tt.post(BASE.format(rid=rid) + "/v1/chat/completions", json={
            "model": "any", "messages": messages, "tools": [TOOL], "max_tokens": 200, "stream": stream})
        assert r.status_code == 200, r.text
        if stream:
            calls: dict[int, dict] = {}
            content = ""
            for chunk in _events(r):
                for choice in chunk["choices"]:
                    content += choice["delta"].get("content") or ""
                    for d in choice["delta"].get("tool_calls") or ():
                        call = calls.setdefault(d["index"], {"id": "", "type": "function",
                                                             "function": {"name": "", "arguments": ""}})
                        call["id"] += d.get("id") or ""
                        call["function"]["name"] += (d.get("function") or {}).get("name") or ""
                        call["function"]["arguments"] += (d.get("function") or {}).get("arguments") or ""
            message = {"role": "assistant", "content": content, "tool_calls": [calls[i] for i in sorted(calls)]}
        else:
            message = {k: v for k, v in r.json()["choices"][0]["message"].items() if v is not None}
        messages.append(message)
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": "a.txt"} for c in message.get("tool_calls", ())]


async def _anthropic(tt: httpx.AsyncClient, rid: str, stream: bool) -> None:
    messages: list[dict] = [{"role": "user", "content": "List the files."}]
    for _ in range(2):
        r = await tt.post(BASE.format(rid=rid) + "/v1/messages", json={
            "model": "claude-x", "max_tokens": 200, "system": SYSTEM, "tools": [BASH], "messages": messages,
            "stream": stream})
        assert r.status_code == 200, r.text
        if stream:
            return  # the streamed request is the same chat body but for `stream`; one turn covers it
        content = r.json()["content"]
        messages.append({"role": "assistant", "content": content})
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": b["id"], "content": "a.txt"}
                                                     for b in content if b["type"] == "tool_use"] or "go on"})


async def _responses(tt: httpx.AsyncClient, rid: str, stream: bool) -> None:
    items: list[dict] = [{"role": "user", "content": "List the files."}]
    for _ in range(2):
        r = await tt.post(BASE.format(rid=rid) + "/v1/responses", json={
            "model": "gpt-x", "instructions": SYSTEM, "input": items, "tools": [RESP_BASH],
            "max_output_tokens": 200, "stream": stream})
        assert r.status_code == 200, r.text
        if stream:
            return
        output = r.json()["output"]
        items += output
        items += [{"type": "function_call_output", "call_id": o["call_id"], "output": "a.txt"}
                  for o in output if o["type"] == "function_call"]


@pytest.fixture
async def recorded(publisher) -> RecordingEngine:
    engine = await _conversation("0.34", publisher)
    assert len([e for e in publisher.events if isinstance(e.body, CallCaptured)]) >= 8
    return engine


REQUEST_MODELS = {"/v1/chat/completions": "ChatCompletionRequest",
                  "/v1/chat/completions/render": "ChatCompletionRequest", "/tokenize": "TokenizeChatRequest",
                  "/inference/v1/generate": "GenerateRequest"}


def test_the_description_is_0_34_from_its_wheel():
    assert DESCRIPTION["vllm"]["version"] == PRODUCTION == "0.34.0"
    assert DESCRIPTION["vllm"]["sha256"] == "79ca4b3cd74aec08c4bf476bdf0cb15735b605ae5368526a2faae1e30f044ca2"
    assert DESCRIPTION["finish_reasons"] == ["stop", "length", "abort", "error", "repetition"]
    assert "POST /checkpoint/prepare" in DESCRIPTION["routes"]
    message, usage = DESCRIPTION["classes"]["ChatMessage"], DESCRIPTION["classes"]["UsageInfo"]
    assert message["fields"]["annotations"]["omitted_when_none"] and "tool_calls" in message["serializer_drops"]
    assert usage["fields"]["prompt_tokens_details"]["omitted_when_none"]


async def test_every_request_tokentrail_sends_fits_0_34s_request_models(recorded):
    sent = {e.path for e in recorded.exchanges}
    assert {"/v1/chat/completions", "/v1/chat/completions/render"} <= sent, sent
    assert sent <= {*REQUEST_MODELS, "/v1/models"}, sent
    generated = [e.request for e in recorded.exchanges if e.path == "/inference/v1/generate"]
    assert len(generated) >= 2  # the startup probe, and the streamed chat turn whose ids were supplied (0.34 way)
    assert all(g["output_mode"] == "derender" and g["stream"] and g["return_token_ids"] for g in generated)
    bodies = [e.request for e in recorded.exchanges if e.path == "/v1/chat/completions" and "tools" in e.request]
    assert len(bodies) >= 8  # the harnesses' calls (not the startup probe)
    assert all(b["return_token_ids"] and b["logprobs"] and b["return_weight_versions"] for b in bodies)
    assert any("prompt_token_ids" in (b.get("kv_transfer_params") or {}) for b in bodies)  # prefix supplied
    assert any(b.get("stream") for b in bodies) and any(not b.get("stream") for b in bodies)
    for e in recorded.exchanges:
        if e.path in REQUEST_MODELS:
            assert CONTRACT.problems(e.request, REQUEST_MODELS[e.path], "request") == [], e.request


async def test_every_answer_of_the_stand_in_fits_0_34s_response_models(recorded):
    checked = 0
    for e in recorded.exchanges:
        if e.path == "/v1/models" or e.status != 200:
            continue
        for value, model, mode in _answers(e):
            assert CONTRACT.problems(value, model, mode) == [], (e.path, value)
            checked += 1
    assert checked > 30


def _answers(e: Exchange) -> list[tuple[Any, str, str]]:
    if e.path == "/v1/chat/completions/render":
        return [(e.answer, "GenerateRequest", "dump")]
    if e.path == "/tokenize":
        return [(e.answer, "TokenizeResponse", "dump")]
    if e.path == "/inference/v1/generate":
        return [(c, "GenerateDerenderStreamResponse", "chunk" if c["choices"] else "exclude_none") for c in e.answer]
    if not e.stream:
        return [(e.answer, "ChatCompletionResponse", "dump")]
    return [(c, "ChatCompletionStreamResponse", "chunk" if c["choices"] else "exclude_none") for c in e.answer]


@pytest.mark.parametrize("body,status", [
    ({"model": "nope", "messages": [{"role": "user", "content": "hi"}]}, 404),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10 ** 6}, 400),
    ({"messages": [{"role": "user", "content": "hi"}], "tools": [TOOL],
      "tool_choice": {"type": "function", "function": {"name": "Nope"}}}, 400),
])
async def test_error_bodies_fit_0_34s_error_response(body, status):
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app()), base_url="http://p") as client:
        r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == status and CONTRACT.problems(r.json(), "ErrorResponse", "dump") == []


async def test_empty_tools_are_a_request_0_34_takes():
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app()), base_url="http://p") as client:
        body = {"messages": [{"role": "user", "content": "hi"}], "tools": [], "tool_choice": "auto",
                "return_token_ids": True, "logprobs": True}
        r = await client.post("/v1/chat/completions", json=body)
    assert CONTRACT.problems(body, "ChatCompletionRequest", "request") == []
    assert r.status_code == 200 and CONTRACT.problems(r.json(), "ChatCompletionResponse", "dump") == []


async def test_checkpoint_state_bodies_fit_0_34():
    app = create_app(sleep_mode=True)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as client:
        for method, path in (("GET", "/checkpoint/status"), ("POST", "/checkpoint/prepare?mode=abort"),
                             ("POST", "/checkpoint/restore")):
            r = await client.request(method, path)
            assert CONTRACT.problems(r.json(), "CheckpointStateResponse", "exclude_none") == []


# -- the check can fail -------------------------------------------------------------------

def _renamed(cls: str, old: str, new: str) -> Contract:
    description = copy.deepcopy(DESCRIPTION)
    fields = description["classes"][cls]["fields"]
    description["classes"][cls]["fields"] = {new if k == old else k: v for k, v in fields.items()}
    return Contract(description)


async def test_a_request_field_renamed_upstream_is_caught(recorded):
    contract = _renamed("ChatCompletionRequest", "return_token_ids", "return_tokens")
    body = next(e.request for e in recorded.exchanges if e.path == "/v1/chat/completions")
    problems = contract.problems(body, "ChatCompletionRequest", "request")
    assert len(problems) == 1 and "'return_token_ids'" in problems[0] and "ignore it silently" in problems[0]


async def test_a_response_field_renamed_upstream_is_caught(recorded):
    contract = _renamed("ChatCompletionResponseChoice", "token_ids", "output_token_ids")
    answer = next(e.answer for e in recorded.exchanges if e.path == "/v1/chat/completions" and not e.stream)
    problems = contract.problems(answer, "ChatCompletionResponse", "dump")
    assert any("no field 'token_ids'" in p for p in problems) and any("'output_token_ids'" in p for p in problems)


async def test_0_33_shaped_answers_break_the_0_34_contract_where_0_34_omits_nulls(publisher):
    engine = await _conversation("0.33", publisher)  # the capture and translators take both shapes:
    assert len([e for e in publisher.events if isinstance(e.body, CallCaptured)]) >= 8  # all captured
    answer = next(e.answer for e in engine.exchanges if e.path == "/v1/chat/completions" and not e.stream)
    problems = CONTRACT.problems(answer, "ChatCompletionResponse", "dump")
    assert len(problems) == 2 and all("leaves the key out" in p for p in problems), problems
    assert any("annotations" in p for p in problems) and any("prompt_tokens_details" in p for p in problems)


def test_a_wrong_type_and_a_missing_required_field_are_caught():
    problems = CONTRACT.problems({"messages": [], "logprobs": "yes", "top_logprobs": 1.5}, "ChatCompletionRequest",
                                 "request")
    assert len(problems) == 2 and "$.logprobs: 'yes'" in problems[0] and "$.top_logprobs" in problems[1]
    assert CONTRACT.problems({"role": "assistant"}, "DeltaMessage", "chunk") == []
    assert "requires 'token'" in CONTRACT.problems({"logprob": -1.0}, "ChatCompletionLogProb", "dump")[0]
