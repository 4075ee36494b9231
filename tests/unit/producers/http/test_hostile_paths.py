"""Issue 26 (the hostile probe), items 1, 3 and 4 at the ASGI edge: dot segments, bodies on GET, headers, errors.

Before the fix, the route table judged the decoded path (``/v1/models/../../sleep`` is a model id
under ``/v1/models/``, forwarded) while the HTTP client resolved the dot segments when it built
the engine URL, so every engine admin route was one ``..`` away, rollout token or not.
"""

from __future__ import annotations

import json

import httpx
import pytest

from producers.http.app import Interceptor
from producers.http.replies import engine_path
from producers.http.routing import PATH_RULE, path_rule_problem
from producers.services import engine_client
from producers.settings import InterceptorSettings
from tests.unit.compose.asgi_server import serve
from tests.unit.producers import raw_asgi
from tests.unit.producers.conftest import vllm_chat_response

ADMIN = "tokentrail/admin/weight-version"
# Every spelling the probe used, and their twice-encoded and backslash cousins.
DOTTED = [
    f"/v1/models/../../{ADMIN}", f"/v1/models/%2e%2e/%2E%2E/{ADMIN}", f"/v1/models/..%2f..%2f{ADMIN}",
    f"/v1/models/%2e%2e%2f%2e%2e%2f{ADMIN}", f"/v1/models/..%5c..%5c{ADMIN}", f"/v1/models/%252e%252e/%252e%252e/{ADMIN}",
    "/v1/models/./../server_info", "/v1/models/../../is_sleeping", "/v1/models/../../metrics",
    "/v1/chat/completions/render/..", "/v1/models/.", "/health/../sleep",
]
PREFIXES = ["", "/ng-rollout/r-1", "/ng-rollout/r-1/training-token-capture"]


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("tail", DOTTED)
@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_a_dot_segment_is_a_400_naming_the_path_rule_and_nothing_reaches_the_engine(app, upstream, publisher,
                                                                                          prefix, tail, method):
    r = await raw_asgi.call(app, method, (prefix + tail).encode(), body=b'{"version": 9}')
    assert r.status == 400, (r.status, r.body[:300])
    message = r.json()["error"]["message"]
    assert PATH_RULE in message and "route policy: path rule" in message, message
    assert upstream.requests == [] and publisher.all == []
    assert app.metrics.refused.labels(why="path")._value.get() >= 1


async def test_a_rollout_secret_does_not_change_it(publisher, upstream):
    settings = InterceptorSettings(upstream_url="http://engine", bootstrap="unused:9092", control_token="s3cret",
                                   rollout_secret="k" * 32)
    client = httpx.AsyncClient(base_url="http://engine", transport=httpx.MockTransport(upstream.handler))
    app = Interceptor(settings, publisher=publisher, upstream=client)  # type: ignore[arg-type]
    await app.startup()
    r = await raw_asgi.call(app, "GET", f"/ng-rollout/r-1/v1/models/%2e%2e/%2e%2e/{ADMIN}".encode())
    assert r.status == 400 and PATH_RULE in r.json()["error"]["message"]
    assert upstream.requests == []
    await app.shutdown()


@pytest.mark.parametrize("path", ["/v1/models/Qwen/Qwen3-0.6B", "/v1/models/step12.task7-r3", "/v1/models/a..b",
                                  "/v1/models/.hidden", "/ng-rollout/step1.r-2/v1/models"])
def test_dots_inside_a_segment_are_no_dot_segment(path):
    assert path_rule_problem(path, path.encode()) is None


def test_the_raw_path_is_checked_as_well_as_the_decoded_one():
    # A server (or a middleware) whose decoded path reads clean while the raw path says otherwise.
    assert path_rule_problem("/v1/models/x", b"/v1/models/%2e%2e") is not None


async def test_a_get_carries_no_body_to_the_engine(app, upstream):
    r = await raw_asgi.call(app, "GET", b"/v1/models/policy", body=b'{"smuggled": true}')
    assert r.status == 200
    (sent,) = upstream.requests
    assert sent["path"] == "/v1/models/policy" and sent["body"] is None


def test_the_engine_path_encodes_every_percent_so_nothing_re_resolves_it():
    assert engine_path("/v1/models/policy") == "/v1/models/policy"  # the common case: unchanged, no copy
    assert engine_path("/v1/models/org%2Fx") == "/v1/models/org%252Fx"
    assert engine_path("/v1/models/%2e%2e") == "/v1/models/%252e%252e"
    assert engine_path("/v1/models/caf\u00e9") == "/v1/models/caf%C3%A9"


async def _engine_app(seen: list[tuple[str, bytes]], scope_headers: list | None = None):
    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        seen.append((scope["path"], scope.get("raw_path") or b""))
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"object": "list", "data": []}'})
    return app


async def test_over_aiohttp_the_engine_decodes_exactly_the_path_decided_on(publisher):
    """yarl (under the aiohttp transport) decodes %2e and %2F and resolves dot segments: a twice-encoded id
    must reach the engine as the once-decoded path the route table saw."""
    seen: list[tuple[str, bytes]] = []
    async with serve(await _engine_app(seen)) as engine_url:
        settings = InterceptorSettings(upstream_url=engine_url, bootstrap="unused:9092", control_token="s3cret")
        client = engine_client(settings)
        app = Interceptor(settings, publisher=publisher, upstream=client)  # type: ignore[arg-type]
        await app.startup()
        try:
            r = await raw_asgi.call(app, "GET", b"/v1/models/org%252Fx")
            assert r.status == 200, r.body
            r = await raw_asgi.call(app, "GET", b"/v1/models/%252e%252e/%252e%252e/sleep")
            assert r.status == 400, r.body
        finally:
            await app.shutdown()
    forwarded = [path for path, _ in seen if path != "/v1/models"]
    assert forwarded == ["/v1/models/org%2Fx"], seen


async def test_a_forwarded_answer_carries_one_date_and_one_server_header(publisher):
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"object": "list", "data": []},
                              headers={"date": "Mon, 01 Jan 2024 00:00:00 GMT", "server": "engine"})

    settings = InterceptorSettings(upstream_url="http://engine", bootstrap="unused:9092", control_token="s3cret")
    client = httpx.AsyncClient(base_url="http://engine", transport=httpx.MockTransport(handler))
    app = Interceptor(settings, publisher=publisher, upstream=client)  # type: ignore[arg-type]
    await app.startup()
    try:
        async with serve(app) as url, httpx.AsyncClient(base_url=url) as http:
            r = await http.get("/v1/models")
    finally:
        await app.shutdown()
    assert r.status_code == 200
    assert len(r.headers.get_list("date")) == 1 and len(r.headers.get_list("server")) == 1, r.headers


@pytest.mark.parametrize("status", [400, 500, 503])
async def test_a_plain_text_engine_error_is_wrapped_as_a_chat_json_error(app, upstream, status):
    upstream.responses.append(httpx.Response(status, text="Internal Server Error: the worker died",
                                             headers={"content-type": "text/plain"}))
    body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
    r = await raw_asgi.call(app, "POST", b"/ng-rollout/r-1/training-token-capture/v1/chat/completions",
                            body=json.dumps(body).encode())
    assert r.status == status
    payload = r.json()  # JSON, as its content type says
    assert "the worker died" in payload["error"]["message"] and payload["error"]["code"] == status


async def test_a_json_engine_error_is_still_passed_on_as_sent(app, upstream):
    sent = {"error": {"message": "bad", "type": "BadRequestError", "code": 400}, "object": "error"}
    upstream.responses.append(httpx.Response(400, json=sent))
    body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
    r = await raw_asgi.call(app, "POST", b"/ng-rollout/r-1/training-token-capture/v1/chat/completions",
                            body=json.dumps(body).encode())
    assert (r.status, r.json()) == (400, sent)


@pytest.mark.parametrize(("route", "tools", "field"), [
    ("/v1/chat/completions", [{"type": "function", "function": {"name": "f", "parameters": 5}}],
     "tools[0].function.parameters"),
    ("/v1/chat/completions", [{"type": "function", "function": {"name": "f", "parameters": "x"}}],
     "tools[0].function.parameters"),
    ("/v1/responses", [{"type": "function", "name": "f", "parameters": 5}], "tools[0].parameters"),
    ("/v1/responses", [{"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "g",
                                                                       "parameters": [1]}]}],
     "tools[0].tools[0].parameters"),
])
async def test_tool_parameters_must_be_an_object(app, upstream, publisher, route, tools, field):
    body = {"model": "policy", "tools": tools}
    body.update({"messages": [{"role": "user", "content": "hi"}]} if "chat" in route else {"input": "hi"})
    r = await raw_asgi.call(app, "POST", f"/ng-rollout/r-1/training-token-capture{route}".encode(),
                            body=json.dumps(body).encode())
    assert r.status == 400, r.body
    message = r.json()["error"]["message"]
    assert f"'{field}' must be an object" in message and "JSON Schema" in message, message
    assert upstream.requests == [] and publisher.all == []


async def test_tool_parameters_that_are_an_object_or_absent_pass(app, upstream):
    upstream.responses.append(httpx.Response(200, json=vllm_chat_response([1], [2])))
    body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], "tools": [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "g"}}]}
    r = await raw_asgi.call(app, "POST", b"/ng-rollout/r-1/training-token-capture/v1/chat/completions",
                            body=json.dumps(body).encode())
    assert r.status == 200, r.body
