"""Malformed requests, in every dialect, through the interceptor: a 4xx in the caller's dialect naming the
field, never a 5xx, nothing published, nothing sent upstream.

Regressions (a hostile probe): messages / content parts that are not objects, a non-string
chat ``content``, wrong-typed ``tools``, ``stop_sequences`` or image ``source``, a non-string
``model``, JSON nested 255..1,024 levels deep (orjson reads 1,024 levels but writes 254: the
call failed on its way upstream, recorded as the engine's fault), ``//`` paths, all answered
500 (most of them bare, naming nothing); Anthropic ``stop_sequences: "END"`` was split into
characters and ``messages: []`` accepted; the Responses error event said ``sequence_number: 0``;
a non-ASCII header value failed an otherwise valid call.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import httpx
import pytest

from producers.http.app import Interceptor
from producers.settings import InterceptorSettings
from tests.unit.producers import raw_asgi
from tests.unit.producers.conftest import vllm_chat_response

ROUTES = {"chat": "/v1/chat/completions", "anthropic": "/v1/messages", "responses": "/v1/responses"}
CAPTURE = "/ng-rollout/r-1/training-token-capture"
VALID = {
    "chat": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    "anthropic": {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]},
    "responses": {"model": "m", "input": [{"role": "user", "content": "hi"}]},
}
# Where each dialect keeps its conversation, and its first item.
ITEMS = {"chat": "messages", "anthropic": "messages", "responses": "input"}


def nested(depth: int) -> str:
    """A placeholder for ``depth`` nested lists around "x", spliced in by ``encode`` (Python's json and
    orjson cannot write what the probe sends)."""
    return f"__nested_{depth}__"


def encode(body: Any) -> bytes:
    return re.sub(r'"__nested_(\d+)__"', lambda m: "[" * int(m[1]) + '"x"' + "]" * int(m[1]),
                  json.dumps(body)).encode()


def with_first_item(dialect: str, **fields: Any) -> dict:
    body = copy.deepcopy(VALID[dialect])
    body[ITEMS[dialect]][0].update(fields)
    return body


def with_fields(dialect: str, **fields: Any) -> dict:
    return {**copy.deepcopy(VALID[dialect]), **fields}


def image(source: Any) -> dict:
    return with_first_item("anthropic", content=[{"type": "image", "source": source}])


# case -> {dialect: (body, what the message must name)}
CASES: dict[str, dict[str, tuple[Any, str]]] = {
    "item is a string": {d: (with_fields(d, **{ITEMS[d]: ["hi"]}), f"{ITEMS[d]}[0]") for d in ROUTES},
    "item is null": {d: (with_fields(d, **{ITEMS[d]: [None]}), f"{ITEMS[d]}[0]") for d in ROUTES},
    "second item is a number": {d: (with_fields(d, **{ITEMS[d]: [VALID[d][ITEMS[d]][0], 7]}), f"{ITEMS[d]}[1]")
                                for d in ROUTES},
    "items not a list": {d: (with_fields(d, **{ITEMS[d]: {"role": "user"}}), ITEMS[d]) for d in ROUTES},
    "content part is a string": {d: (with_first_item(d, content=["hi"]), f"{ITEMS[d]}[0].content[0]")
                                 for d in ROUTES},
    "content part is a number": {d: (with_first_item(d, content=[{"type": "text", "text": "a"}, 3]),
                                     f"{ITEMS[d]}[0].content[1]") for d in ("chat", "anthropic")}
                                | {"responses": (with_first_item("responses", content=[
                                    {"type": "input_text", "text": "a"}, 3]), "input[0].content[1]")},
    "content is a number": {d: (with_first_item(d, content=5), f"{ITEMS[d]}[0]") for d in ROUTES},
    "content is an object": {d: (with_first_item(d, content={"text": "hi"}), f"{ITEMS[d]}[0]") for d in ROUTES},
    "tools is a string": {d: (with_fields(d, tools="Bash"), "tools") for d in ROUTES},
    "tools is an object": {d: (with_fields(d, tools={"name": "Bash"}), "tools") for d in ROUTES},
    "a tool is a string": {d: (with_fields(d, tools=["Bash"]), "tools[0]") for d in ROUTES},
    "model is an object": {d: (with_fields(d, model={"id": "m"}), "model") for d in ROUTES},
    "model is a list": {d: (with_fields(d, model=["m"]), "model") for d in ROUTES},
    "stream is a string": {d: (with_fields(d, stream="yes"), "stream") for d in ROUTES},
    "max tokens is a string": {"chat": (with_fields("chat", max_tokens="5"), "max_tokens"),
                               "anthropic": (with_fields("anthropic", max_tokens="5"), "max_tokens"),
                               "responses": (with_fields("responses", max_output_tokens="5"), "max_output_tokens")},
    "stop_sequences is a string": {"anthropic": (with_fields("anthropic", stop_sequences="END"), "stop_sequences")},
    "stop_sequences is a number": {"anthropic": (with_fields("anthropic", stop_sequences=5), "stop_sequences")},
    "stop_sequences is an object": {"anthropic": (with_fields("anthropic", stop_sequences={"a": 1}),
                                                  "stop_sequences")},
    "a stop sequence is a number": {"anthropic": (with_fields("anthropic", stop_sequences=["END", 5]),
                                                  "stop_sequences[1]")},
    "messages is empty": {"anthropic": (with_fields("anthropic", messages=[]), "messages")},
    "image source is a string": {"anthropic": (image("https://x/y.png"), "messages[0].content[0].source")},
    "image source is a list": {"anthropic": (image([1]), "messages[0].content[0].source")},
    "image source is missing": {"anthropic": (image(None), "messages[0].content[0].source")},
    "tool_choice is a string": {"anthropic": (with_fields("anthropic", tool_choice="auto", tools=[
        {"name": "Bash", "input_schema": {"type": "object"}}]), "tool_choice")},
    "thinking is a string": {"anthropic": (with_fields("anthropic", thinking="on"), "thinking")},
    "temperature is a string": {d: (with_fields(d, temperature="hot"), "temperature") for d in ("anthropic",
                                                                                               "responses")},
    "system is a number": {"anthropic": (with_fields("anthropic", system=3), "system")},
    "role is missing": {"chat": (with_fields("chat", messages=[{"content": "hi"}]), "messages[0].role")},
    "tool_calls is a string": {"chat": (with_first_item("chat", role="assistant", tool_calls="Bash"),
                                        "messages[0].tool_calls")},
    "a tool call's function is a string": {"chat": (with_first_item("chat", role="assistant", tool_calls=[
        {"id": "c1", "type": "function", "function": "Bash"}]), "messages[0].tool_calls[0].function")},
    "reasoning item content is a string": {"responses": (with_fields("responses", input=[
        {"type": "reasoning", "content": "thought"}, {"role": "user", "content": "hi"}]), "input[0].content")},
    "function_call_output output is an object": {"responses": (with_fields("responses", input=[
        {"type": "function_call_output", "call_id": "c", "output": {"a": 1}}]), "input[0].output")},
    "text is a string": {"responses": (with_fields("responses", text="json"), "text")},
    "text.format is a string": {"responses": (with_fields("responses", text={"format": "json"}), "text.format")},
    "reasoning is a string": {"responses": (with_fields("responses", reasoning="high"), "reasoning")},
    "instructions is a number": {"responses": (with_fields("responses", instructions=1), "instructions")},
    # orjson reads 1,024 levels but writes only 254: refused up front, naming the field.
    **{f"a field nested {n} deep": {d: (with_fields(d, metadata=nested(n)), "metadata") for d in ROUTES}
       for n in (201, 254, 255, 600, 1023)},
    "content nested 300 deep": {d: (with_first_item(d, content=[{"type": "text", "text": "a",
                                                                 "extra": nested(300)}]),
                                    f"{ITEMS[d]}[0].content[0].extra") for d in ROUTES},
}
ROWS = [(case, dialect, body, field) for case, per in CASES.items() for dialect, (body, field) in per.items()]

RAW_BODIES = [  # (raw body, what the message must say)
    (b"[" * 1100 + b"]" * 1100, "1024 levels"),
    (b'{"model": "m", "metadata": ' + b"[" * 1100 + b"]" * 1100 + b"}", "1024 levels"),
    (b"[1, 2]", "JSON object"),
    (b'"hi"', "JSON object"),
    (b"null", "JSON object"),
    (b"{nope", "not valid JSON"),
    (b'{"model": "m", "messages": [], "x": 1e400}', "not valid JSON"),
    (b"", "empty"),
]


@pytest.fixture
async def http(app):
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://tt") as client:
        yield client


def error_message(dialect: str, payload: dict) -> str:
    """The message, checking the error has the shape the dialect's SDK reads."""
    if dialect == "anthropic":
        assert payload["type"] == "error" and isinstance(payload["error"]["type"], str), payload
        return payload["error"]["message"]
    error = payload["error"]
    assert isinstance(error["type"], str) and "code" in error, payload
    if dialect == "responses":
        assert "param" in error and isinstance(error["code"], str), payload
    return error["message"]


@pytest.mark.parametrize("case, dialect, body, field", ROWS, ids=[f"{d}: {c}" for c, d, _, _ in ROWS])
async def test_a_malformed_body_is_a_4xx_naming_the_field(http, publisher, upstream, case, dialect, body, field):
    r = await http.post(CAPTURE + ROUTES[dialect], content=encode(body))
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    message = error_message(dialect, r.json())
    assert field in message, message
    assert publisher.events == [] and upstream.requests == []


@pytest.mark.parametrize("dialect", ROUTES)
@pytest.mark.parametrize("raw, needle", RAW_BODIES, ids=[n + str(len(r)) for r, n in RAW_BODIES])
async def test_a_body_that_is_not_a_json_object_is_a_4xx_saying_why(http, publisher, upstream, dialect, raw, needle):
    r = await http.post(CAPTURE + ROUTES[dialect], content=raw)
    assert r.status_code == 400, r.text
    assert needle in error_message(dialect, r.json())
    assert publisher.events == [] and upstream.requests == []


# Every top-level field (and every field of the first item) set to each wrong-typed value: the
# interceptor may serve it (a field it passes through), or refuse it naming it; never a 5xx.
WRONG = ["x", 7, -1.5, True, {"a": 1}, [1], [None], [[{}]], {"type": None}]
TOP_FIELDS = {
    "chat": ["model", "messages", "stream", "tools", "max_tokens", "max_completion_tokens", "logprobs",
             "top_logprobs", "stream_options", "n", "temperature", "stop", "tool_choice"],
    "anthropic": ["model", "messages", "system", "max_tokens", "temperature", "top_p", "top_k", "stop_sequences",
                  "stream", "tools", "tool_choice", "thinking", "metadata"],
    "responses": ["model", "input", "instructions", "tools", "tool_choice", "max_output_tokens", "temperature",
                  "top_p", "stream", "reasoning", "text", "include"],
}
ITEM_FIELDS = {"chat": ["role", "content", "tool_calls", "name", "tool_call_id"],
               "anthropic": ["role", "content"], "responses": ["role", "content", "type"]}
SWEEP = ([(d, "top", f, v) for d, fields in TOP_FIELDS.items() for f in fields for v in WRONG]
         + [(d, "item", f, v) for d, fields in ITEM_FIELDS.items() for f in fields for v in WRONG])


@pytest.mark.parametrize("dialect, where, field, value", SWEEP,
                         ids=[f"{d}-{w}-{f}-{json.dumps(v)}" for d, w, f, v in SWEEP])
async def test_no_wrong_typed_field_is_ever_a_5xx(http, publisher, upstream, dialect, where, field, value):
    body = with_fields(dialect, **{field: value}) if where == "top" else with_first_item(dialect, **{field: value})
    upstream.responses.append(httpx.Response(200, json=vllm_chat_response([1], [2])))
    r = await http.post(CAPTURE + ROUTES[dialect], content=json.dumps(body))
    assert r.status_code < 500, (r.status_code, r.text)
    if r.status_code >= 400 and r.headers.get("content-type", "").startswith("application/json"):
        assert field in error_message(dialect, r.json())


def test_the_table_covers_every_dialect_and_the_probe_cases():
    assert {d for _, d, _, _ in ROWS} == set(ROUTES)
    for case in ("item is a string", "content part is a string", "tools is a string", "a field nested 255 deep",
                 "a field nested 1023 deep"):
        assert set(CASES[case]) == set(ROUTES)


@pytest.mark.parametrize("raw_path, api_path", [
    (b"//v1/chat/completions", "//v1/chat/completions"),
    (b"//v1/models", "//v1/models"),
    (b"//", "//"),
    (b"/ng-rollout/r-1/training-token-capture//v1/chat/completions", "//v1/chat/completions"),
    (b"/ng-rollout/r-1/training-token-capture//v1/messages", "//v1/messages"),
    (b"/ng-rollout/r-1//v1/models", "//v1/models"),
    (b"/v1/mo%09dels", "/v1/mo\tdels"),
])
async def test_a_path_that_cannot_be_forwarded_is_a_400_naming_it(app, publisher, upstream, raw_path, api_path):
    r = await raw_asgi.call(app, "POST", raw_path, body=json.dumps(VALID["chat"]).encode())
    assert r.status == 400, r.body
    dialect = "anthropic" if api_path.endswith("/v1/messages") else "chat"
    message = error_message(dialect, r.json())
    assert f"invalid request path {api_path!r}" in message, message
    assert publisher.events == [] and upstream.requests == []


@pytest.mark.parametrize("dialect", ROUTES)
async def test_a_non_ascii_header_value_is_forwarded_as_its_bytes_and_the_call_served(publisher, dialect):
    seen: list[list[tuple[bytes, bytes]]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "policy", "max_model_len": 4096}]})
        seen.append(list(request.headers.raw))
        return httpx.Response(200, json=vllm_chat_response([1], [2]))

    client = httpx.AsyncClient(base_url="http://engine", transport=httpx.MockTransport(handler))
    app = Interceptor(InterceptorSettings(upstream_url="http://engine", bootstrap="unused:9092",
                                          control_token="s3cret"), publisher=publisher, upstream=client)
    await app.startup()
    # x-request-id: an allow-listed header (producers.http.replies.FORWARDED_REQUEST_HEADERS); x-harness-note is
    # not on the list, so it no longer reaches the engine (issue 15 item 12).
    headers = [(b"x-request-id", b"caf\xe9 cr\xe8me"), (b"user-agent", b"agent/\xe9"),
               (b"x-harness-note", b"caf\xe9")]
    r = await raw_asgi.call(app, "POST", (CAPTURE + ROUTES[dialect]).encode(),
                            body=json.dumps(VALID[dialect]).encode(), headers=headers)
    assert r.status == 200, r.body
    (sent,) = seen
    assert (b"x-request-id", b"caf\xe9 cr\xe8me") in sent and (b"user-agent", b"agent/\xe9") in sent
    assert all(name != b"x-harness-note" for name, _ in sent)
    (event,) = publisher.events
    assert event.body.facts.user_agent == "agent/\xe9"
    # forwarded routes too
    r = await raw_asgi.call(app, "GET", b"/v1/models", headers=headers)
    assert r.status == 200
    await app.shutdown()


def sse_events(text: str) -> list[dict]:
    return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:") and "{" in line]


CHUNK = 'data: {{"choices":[{{"index":0,"delta":{{"content":"{t}"}},"token_ids":[5]}}],"prompt_token_ids":[1]}}\n\n'


async def test_the_responses_error_event_continues_the_stream_sequence(http, upstream, publisher):
    sse = (CHUNK.format(t="Hel") + CHUNK.format(t="lo")
           + 'data: {"error":{"message":"KV load failed","type":"InternalServerError","code":500}}\n\n')
    upstream.responses.append(httpx.Response(200, content=sse.encode(), headers={"content-type": "text/event-stream"}))
    r = await http.post(CAPTURE + ROUTES["responses"], json={**VALID["responses"], "stream": True})
    events = sse_events(r.text)
    assert events[-1]["type"] == "error" and len(events) > 3
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


async def test_the_error_event_after_a_failed_durable_write_numbers_after_what_was_sent(http, upstream, publisher):
    # The terminal events are built (numbered) but never sent when the capture cannot be made durable.
    sse = (CHUNK.format(t="Hi").replace('"token_ids":[5]', '"token_ids":[5],"finish_reason":"stop",'
                                                           '"logprobs":{"content":[{"token":"Hi","logprob":-0.1}]}')
           + "data: [DONE]\n\n")
    class BrokerGoesDown(httpx.AsyncByteStream):  # after the call's intent was acknowledged
        async def __aiter__(self):
            publisher.fail = True
            yield sse.encode()

    upstream.responses.append(httpx.Response(200, stream=BrokerGoesDown(), headers={"content-type": "text/event-stream"}))
    r = await http.post(CAPTURE + ROUTES["responses"], json={**VALID["responses"], "stream": True})
    events = sse_events(r.text)
    assert events[-1]["type"] == "error" and "durable" in events[-1]["message"]
    assert not any(e["type"] in ("response.completed", "response.output_item.done") for e in events)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
