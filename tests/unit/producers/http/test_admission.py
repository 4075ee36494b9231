"""Admission before any handler (producers.http.admission): rollout tokens (issue 15 item 8) and the body limit (item 10)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import httpx
import pytest

from producers.http.app import Interceptor
from producers.settings import InterceptorSettings
from schemas.records import CallCaptured
from schemas.rollout_tokens import rollout_token
from tests.unit.producers.conftest import vllm_chat_response

SECRET = "a-rollout-secret-of-32-bytes-000"
CHAT = "/ng-rollout/{rid}/training-token-capture/v1/chat/completions"
MESSAGES = "/ng-rollout/{rid}/training-token-capture/v1/messages"
HELLO = [{"role": "user", "content": "hi"}]


@pytest.fixture
async def make(publisher, upstream):
    made = []

    async def build(**overrides):
        settings = InterceptorSettings(**{"upstream_url": "http://engine", "bootstrap": "unused:9092",
                                          "control_token": "s3cret", **overrides})
        client = httpx.AsyncClient(base_url="http://engine", transport=httpx.MockTransport(upstream.handler))
        app = Interceptor(settings, publisher=publisher, upstream=client)  # type: ignore[arg-type]
        await app.startup()
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://tt")
        made.append((http, app))
        return http, app

    yield build
    for http, app in made:
        await http.aclose()
        await app.shutdown()


# -- rollout tokens --------------------------------------------------------------------------

async def test_without_the_rollouts_token_nothing_is_recorded_or_forwarded(make, upstream, publisher):
    http, _ = await make(rollout_secret=SECRET)
    other = rollout_token(SECRET, "attacker")
    for headers in ({}, {"authorization": f"Bearer {other}"}, {"x-api-key": other}, {"x-goog-api-key": other},
                    {"authorization": other},
                    {"authorization": "Bearer sk-real-openai-key"}):
        r = await http.post(CHAT.format(rid="victim"), json={"model": "m", "messages": HELLO}, headers=headers)
        assert r.status_code == 401, (headers, r.text)
        message = r.json()["error"]["message"]
        assert "'victim' needs its rollout token" in message and "tokentrail token" in message
        # the eval prefix and read-only routes under it too: nothing reaches a rollout without its token
        assert (await http.get("/ng-rollout/victim/v1/models", headers=headers)).status_code == 401
    assert publisher.events == [] and upstream.requests == [] and upstream.model_requests == []


async def test_an_anthropic_caller_gets_the_401_in_its_shape(make, upstream, publisher):
    http, _ = await make(rollout_secret=SECRET)
    r = await http.post(MESSAGES.format(rid="r-1"), json={"model": "m", "max_tokens": 8, "messages": HELLO})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"


@pytest.mark.parametrize("header", ["authorization", "x-api-key", "x-goog-api-key"])
async def test_the_rollouts_token_as_the_api_key_is_served_and_never_reaches_the_engine(make, upstream, publisher,
                                                                                        header):
    http, _ = await make(rollout_secret=SECRET)
    token = rollout_token(SECRET, "r-1")
    value = f"Bearer {token}" if header == "authorization" else token
    upstream.responses.append(httpx.Response(200, json=vllm_chat_response([1], [2])))
    r = await http.post(CHAT.format(rid="r-1"), json={"model": "m", "messages": HELLO}, headers={header: value})
    assert r.status_code == 200, r.text
    assert len([e for e in publisher.events if isinstance(e.body, CallCaptured)]) == 1
    for sent in upstream.requests + upstream.model_requests:
        assert token not in json.dumps(sent["headers"])
        assert not {"authorization", "x-api-key", "x-goog-api-key"} & set(sent["headers"])


async def test_without_a_secret_every_rollout_is_open(make, upstream, publisher):
    http, _ = await make()
    upstream.responses.append(httpx.Response(200, json=vllm_chat_response([1], [2])))
    assert (await http.post(CHAT.format(rid="r-1"), json={"model": "m", "messages": HELLO})).status_code == 200


def test_a_short_secret_is_refused_without_echoing_it():
    with pytest.raises(ValueError, match="at least 16") as info:
        InterceptorSettings(upstream_url="http://e", bootstrap="k:9092", rollout_secret="hunter2hunter2")
    assert "hunter2" not in str(info.value)


def test_the_cli_prints_a_rollouts_token_from_the_environment(tmp_path):
    run = [sys.executable, "-m", "compose.cli", "token", "step12.task7-r3"]
    out = subprocess.run(run, capture_output=True, text=True, env={"TOKENTRAIL_ROLLOUT_SECRET": SECRET,
                                                                   "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == rollout_token(SECRET, "step12.task7-r3")
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET + "\n")
    out = subprocess.run([*run, "--secret-file", str(secret_file)], capture_output=True, text=True, env={})
    assert out.stdout.strip() == rollout_token(SECRET, "step12.task7-r3")
    out = subprocess.run(run, capture_output=True, text=True, env={})
    assert out.returncode == 2 and "TOKENTRAIL_ROLLOUT_SECRET" in out.stderr


# -- the body limit --------------------------------------------------------------------------

@pytest.mark.parametrize("path", [CHAT.format(rid="r-1"), MESSAGES.format(rid="r-1"),
                                  "/ng-rollout/r-1/v1/chat/completions", "/v1/chat/completions",
                                  "/ng-rollout/r-1/training-token-capture/v1/messages/count_tokens"])
async def test_a_declared_body_over_the_limit_is_a_413_naming_the_setting(make, upstream, publisher, path):
    http, _ = await make(max_body_bytes=1000)
    r = await http.post(path, content=b"x" * 1001, headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text
    assert "max_body_bytes" in r.text and "1000 bytes" in r.text and "1001 bytes" in r.text
    assert publisher.events == [] and upstream.requests == []


async def test_a_body_at_the_limit_is_served(make, upstream, publisher):
    http, _ = await make(max_body_bytes=1000)
    body = json.dumps({"model": "m", "messages": HELLO}).encode()
    body += b" " * (1000 - len(body))
    upstream.responses.append(httpx.Response(200, json=vllm_chat_response([1], [2])))
    r = await http.post(CHAT.format(rid="r-1"), content=body, headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text


async def test_a_streamed_body_is_counted_as_it_arrives_and_reading_stops_past_the_limit(make, upstream, publisher):
    _, app = await make(max_body_bytes=1000)
    received = 0

    async def receive():  # a chunked body without Content-Length, 400 bytes a message, never ending
        nonlocal received
        received += 1
        await asyncio.sleep(0)
        return {"type": "http.request", "body": b"x" * 400, "more_body": True}

    sent = []

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": CHAT.format(rid="r-1"), "raw_path": CHAT.format(rid="r-1").encode(), "query_string": b"",
             "root_path": "", "server": ("tt", 80), "client": ("127.0.0.1", 5000),
             "headers": [(b"host", b"tt"), (b"content-type", b"application/json"),
                         (b"transfer-encoding", b"chunked")]}
    await asyncio.wait_for(app(scope, receive, send), 5)
    assert sent[0]["status"] == 413 and b"max_body_bytes" in sent[1]["body"]
    assert received == 3  # 1200 bytes > 1000: stopped at the third message, not read on
    assert publisher.events == [] and upstream.requests == []


def _receiver(*messages: dict):
    queue = list(messages)
    taken: list[dict] = []

    async def receive() -> dict:
        taken.append(queue.pop(0))
        return taken[-1]

    return receive, taken


def _sender(sent: list[dict]):
    async def send(message: dict) -> None:
        sent.append(message)

    return send


@pytest.mark.parametrize(("messages", "ended", "read"), [
    ([{"type": "http.request", "body": b"a" * 10, "more_body": True},
      {"type": "http.request", "body": b"b" * 10, "more_body": False}], True, 2),  # the whole body
    ([{"type": "http.request", "body": b"", "more_body": False}], True, 1),  # none (a GET)
    ([{"type": "http.request", "body": b"a" * 10, "more_body": True}, {"type": "http.disconnect"}], True, 2),
    ([{"type": "http.request", "body": b"a" * 60, "more_body": True},
      {"type": "http.request", "body": b"b" * 60, "more_body": True},
      {"type": "http.request", "body": b"never read", "more_body": False}], False, 2),  # past the limit: stop
])
def test_drain_reads_the_rest_of_a_body_within_the_limit(messages, ended, read):
    from producers.http.admission import drain

    receive, taken = _receiver(*messages)
    assert asyncio.run(drain(receive, 100)) is ended
    assert len(taken) == read


async def test_a_refusal_before_the_body_was_read_reads_it_first_and_one_past_the_limit_closes(make, upstream,
                                                                                                publisher):
    """The refused request's body is drained before the answer (no reset); one too large is answered with a close."""
    _, app = await make(max_body_bytes=100)
    for size, closes in ((80, False), (300, True)):
        chunks = [b"x" * 20] * (size // 20)
        messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
        receive, taken = _receiver(*messages)
        sent: list[dict] = []
        send = _sender(sent)
        scope = {"type": "http", "method": "POST", "path": "/nope", "raw_path": b"/nope", "query_string": b"",
                 "headers": [(b"content-type", b"application/json")], "http_version": "1.1"}
        await app(scope, receive, send)
        assert sent[0]["status"] == 404
        assert ((b"connection", b"close") in sent[0]["headers"]) is closes
        assert len(taken) == (6 if closes else len(chunks))  # past the limit (100 bytes): no more is read
    assert not publisher.events and not upstream.requests
