"""Per-token policy versions at capture (producers.capture.call_versions.version_facts, producers.capture.version_clock).

The engine's own spans win when they name a version; a stream the engine labels nothing is split
where the announced version changed as its chunks arrived; a non-streamed call is bracketed.
"""

from __future__ import annotations

import json

import httpx
import pytest

from producers.http.app import Interceptor
from producers.settings import InterceptorSettings
from schemas.records import CallCaptured, CallIncomplete, VersionSpan
from tests.unit.producers.conftest import vllm_chat_response

CHAT = "/ng-rollout/{rid}/training-token-capture/v1/chat/completions"
BODY = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}


def span(version: str, start: int, end: int) -> VersionSpan:
    return VersionSpan(version=version, start=start, end=end)


def captured(publisher) -> list[CallCaptured]:
    return [e.body for e in publisher.events if isinstance(e.body, CallCaptured)]


@pytest.fixture
async def over(publisher):
    """An interceptor over ``handler`` (an httpx MockTransport handler, async allowed)."""
    made = []

    async def make(handler, **overrides):
        settings = InterceptorSettings(**{"upstream_url": "http://engine", "bootstrap": "unused:9092",
                                          "control_token": "s3cret", **overrides})
        upstream = httpx.AsyncClient(base_url="http://engine", transport=httpx.MockTransport(handler))
        app = Interceptor(settings, publisher=publisher, upstream=upstream)  # type: ignore[arg-type]
        await app.startup()
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://tt", timeout=30)
        made.append((http, app))
        return http, app

    yield make
    for http, app in made:
        await http.aclose()
        await app.shutdown()


def _models(request: httpx.Request) -> httpx.Response | None:
    if request.method == "GET" and request.url.path == "/v1/models":
        return httpx.Response(200, json={"object": "list", "data": [{"id": "policy", "max_model_len": 4096}]})
    return None


@pytest.mark.parametrize(("spans", "expected", "source"), [
    ([{"version": "v3", "start": 0, "end": 2}, {"version": "v4", "start": 2, "end": 3}],
     [span("v3", 0, 2), span("v4", 2, 3)], "engine"),
    # vLLM labels unnamed weights "default": no version, so the announced one (admin route) is bracketed.
    ([{"version": "default", "start": 0, "end": 3}], [span("step-1", 0, 3)], "bracket"),
])
async def test_engine_spans_win_when_they_name_a_version(over, publisher, spans, expected, source):
    def handler(request):
        if (r := _models(request)) is not None:
            return r
        body = vllm_chat_response([1, 2], [5, 6, 7])
        body["choices"][0]["weight_versions"] = spans
        return httpx.Response(200, json=body)

    http, app = await over(handler)
    app.core.clock.set_admin("step-1")
    assert (await http.post(CHAT.format(rid="wv"), json=BODY)).status_code == 200
    (call,) = captured(publisher)
    assert call.facts.version_spans == expected and call.facts.version_spans_source == source
    assert call.facts.dispatch_version == call.facts.completion_version == "step-1"


async def test_engine_spans_that_do_not_cover_the_generation_are_not_captured(over, publisher):
    def handler(request):
        if (r := _models(request)) is not None:
            return r
        body = vllm_chat_response([1, 2], [5, 6, 7])
        body["choices"][0]["weight_versions"] = [{"version": "v3", "start": 0, "end": 2}]
        return httpx.Response(200, json=body)

    http, _ = await over(handler)
    await http.post(CHAT.format(rid="wv-bad"), json=BODY)
    (marker,) = [e.body for e in publisher.events if isinstance(e.body, CallIncomplete)]
    assert marker.reason == "partial_token_metadata" and "cover 2 tokens of a generation of 3" in marker.detail
    assert captured(publisher) == []


async def test_a_non_streamed_call_across_an_update_is_bracketed_with_an_unknown_span(over, publisher):
    app_ref = {}

    async def handler(request):
        if (r := _models(request)) is not None:
            return r
        app_ref["app"].core.clock.set_admin("v2")  # the update lands while the engine works
        return httpx.Response(200, json=vllm_chat_response([1, 2], [5, 6, 7]))

    http, app = await over(handler)
    app_ref["app"] = app
    app.core.clock.set_admin("v1")
    await http.post(CHAT.format(rid="br"), json=BODY)
    (call,) = captured(publisher)
    assert (call.facts.dispatch_version, call.facts.completion_version) == ("v1", "v2")
    assert call.facts.version_spans == [span("", 0, 3)] and call.facts.version_spans_source == "bracket"


def chunk(ids: list[int], finish: str | None = None, **top: object) -> dict:
    """A vLLM 0.32 streamed chat chunk carrying ``ids`` (no engine version spans)."""
    lp = [{"token": f"t{t}", "logprob": -0.5, "bytes": [], "top_logprobs": []} for t in ids]
    return {"id": "c", "object": "chat.completion.chunk", "model": "policy", **top,
            "choices": [{"index": 0, "delta": {"content": "x" * len(ids)}, "token_ids": ids,
                         "logprobs": {"content": lp}, "finish_reason": finish}]}


def _sse(chunks: list[dict]) -> list[bytes]:
    return [f"data: {json.dumps(c)}\n\n".encode() for c in chunks] + [b"data: [DONE]\n\n"]


async def test_a_continued_stream_whose_tail_arrives_after_the_announcement_is_not_labelled_new(over, publisher):
    """abort + continue, vLLM 0.32 (no engine spans): the tokens of the aborted part were generated before
    the pause, whatever the announcement their chunks arrived after; never the new version's. Seen in CI on
    real vLLM: the last 541 tokens before an abort reached the interceptor after the trainer's announcement."""
    app_ref: dict = {}
    bodies: list[dict] = []

    async def first_part():
        pieces = _sse([chunk([], prompt_token_ids=[1, 2]), chunk([5, 6]), chunk([7]), chunk([8], finish="abort")])
        for piece in pieces[:2]:
            yield piece
        # Paused, reloaded, announced while the part's last chunks were still on their way: they arrive now.
        app_ref["app"].core.clock.set_admin("v2")
        for piece in pieces[2:]:
            yield piece

    async def continuation():
        for piece in _sse([chunk([], prompt_token_ids=[1, 2, 5, 6, 7, 8]), chunk([9, 10], finish="length")]):
            yield piece

    def handler(request):
        if (r := _models(request)) is not None:
            return r
        bodies.append(json.loads(request.content))
        stream = first_part() if len(bodies) == 1 else continuation()
        return httpx.Response(200, content=stream, headers={"content-type": "text/event-stream"})

    http, app = await over(handler, abort_policy="continue")
    app_ref["app"] = app
    app.core.clock.set_admin("v1")
    r = await http.post(CHAT.format(rid="late"), json={**BODY, "stream": True, "max_tokens": 6})
    assert r.status_code == 200 and "[DONE]" in r.text, r.text
    assert len(bodies) == 2  # the abort was continued
    (call,) = captured(publisher)
    assert call.generation_token_ids == [5, 6, 7, 8, 9, 10] and call.facts.continued == 1
    # Part 0 (dispatched under v1, aborted once v2 was announced) is unknown, so the rollout is masked;
    # the continuation, sent while paused and generated after the resume, is v2's. Its marks alone would
    # have put tokens 7 and 8 of part 0 under v2.
    assert call.facts.version_spans == [span("", 0, 4), span("v2", 4, 6)], call.facts.version_spans


async def test_a_stream_is_split_where_the_announced_version_changed(over, publisher):
    """No engine spans (vLLM 0.32): tokens that reached the interceptor after the announcement are the new version's."""
    app_ref = {}

    async def stream():
        pieces = _sse([chunk([], prompt_token_ids=[1, 2]), chunk([5, 6]), chunk([7])])
        for piece in pieces[:3]:
            yield piece
        app_ref["app"].core.clock.set_admin("v2")  # the engine paused (keep), the trainer announced v2, resumed
        for piece in _sse([chunk([8, 9]), chunk([10], finish="stop")]):
            yield piece

    def handler(request):
        if (r := _models(request)) is not None:
            return r
        return httpx.Response(200, content=stream(), headers={"content-type": "text/event-stream"})

    http, app = await over(handler)
    app_ref["app"] = app
    app.core.clock.set_admin("v1")
    r = await http.post(CHAT.format(rid="obs"), json={**BODY, "stream": True})
    assert r.status_code == 200 and "[DONE]" in r.text
    (call,) = captured(publisher)
    assert call.generation_token_ids == [5, 6, 7, 8, 9, 10]
    assert call.facts.version_spans == [span("v1", 0, 3), span("v2", 3, 6)]
    assert call.facts.version_spans_source == "observed" and call.facts.policy_version == "v1,v2"
