"""Streaming pass-through, request-time lineage and delta records, against the in-process
reference policy server (vLLM 0.33 shapes) with a recording publisher."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from compose.engines.policy.testkit import BASH, parse_sse
from schemas.hashing import compute_digest
from schemas.records import CallCaptured, CallIncomplete, ParentResolution

CHAT = "/ng-rollout/{rid}/training-token-capture/v1/chat/completions"
SYSTEM = {"role": "system", "content": "You are an agent. #tool-calls=2"}


def calls(publisher):
    return [e.body for e in publisher.events if isinstance(e.body, CallCaptured)]


async def _turns(http, rid, n_turns=3, stream=False, check=True):
    messages = [SYSTEM, {"role": "user", "content": "list files"}]
    answers = []
    for _ in range(n_turns):
        r = await http.post(CHAT.format(rid=rid), json={"model": "m", "messages": messages, "tools": [BASH],
                                                          "stream": stream, "seed": 7})
        if not check and r.status_code != 200:
            answers.append(r)
            break
        assert r.status_code == 200, r.text
        if stream:
            chunks = parse_sse(r.text)
            message = _assemble(chunks)
        else:
            message = r.json()["choices"][0]["message"]
        answers.append(r)
        messages.append({k: v for k, v in message.items() if v is not None and k in ("role", "content", "tool_calls")})
        for tc in message.get("tool_calls") or []:
            messages.append({"role": "tool", "tool_call_id": tc["id"], "content": "a.txt b.txt"})
        if not message.get("tool_calls"):
            break
    return answers


def _assemble(chunks):
    content, tools = "", {}
    for c in chunks:
        for ch in c.get("choices") or []:
            d = ch.get("delta") or {}
            content += d.get("content") or ""
            for tc in d.get("tool_calls") or []:
                slot = tools.setdefault(tc["index"], {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
                slot["id"] = tc.get("id") or slot["id"]
                f = tc.get("function") or {}
                slot["function"]["name"] += f.get("name") or ""
                slot["function"]["arguments"] += f.get("arguments") or ""
    msg = {"role": "assistant", "content": content or None}
    if tools:
        msg["tool_calls"] = [tools[i] for i in sorted(tools)]
    return msg


async def test_continuations_resolve_at_request_time_and_store_deltas(make_interceptor, publisher):
    http, _ = await make_interceptor()
    await _turns(http, "lin-1")
    c1, c2, c3 = calls(publisher)
    assert c1.parent_resolution is ParentResolution.ROOT and not c1.prompt_is_delta
    for parent, child in ((c1, c2), (c2, c3)):
        assert child.parent_resolution is ParentResolution.RESOLVED and child.parent_call_id == parent.model_call_id
        assert child.prompt_is_delta and child.parent_digest == parent.digest
        assert child.cum_len == parent.cum_len + len(child.prompt_token_ids) + len(child.generation_token_ids)
    full3 = c1.prompt_token_ids + c1.generation_token_ids + c2.prompt_token_ids + c2.generation_token_ids \
        + c3.prompt_token_ids + c3.generation_token_ids
    assert compute_digest(full3) == c3.digest


async def test_a_changed_context_does_not_resolve(make_interceptor, publisher):
    http, _ = await make_interceptor()
    await _turns(http, "lin-2", n_turns=1)
    (c1,) = calls(publisher)
    items = json.loads(c1.output_items_json)
    echo = {"role": "assistant", "content": None, "tool_calls": [
        {"id": i["call_id"], "type": "function", "function": {"name": i["name"], "arguments": i["arguments"]}}
        for i in items if i["type"] == "function_call"]}
    rewritten = [SYSTEM, {"role": "user", "content": "list files, please"}, echo,
                 {"role": "tool", "tool_call_id": echo["tool_calls"][0]["id"], "content": "a.txt"}]
    await http.post(CHAT.format(rid="lin-2"), json={"model": "m", "messages": rewritten, "tools": [BASH]})
    c2 = calls(publisher)[-1]
    assert c2.parent_resolution is ParentResolution.UNRESOLVED and c2.parent_resolution_reason == "no_match"
    assert not c2.prompt_is_delta and c2.request_fingerprint == c1.continuation_fingerprint


async def test_cold_index_is_unresolved_with_the_fingerprint_for_the_processor(make_interceptor, publisher):
    http, app = await make_interceptor()
    await _turns(http, "lin-3", n_turns=1)
    app.core.index.forget("lin-3")  # another worker would not know this rollout
    (c1,) = calls(publisher)
    items = json.loads(c1.output_items_json)
    echo = {"role": "assistant", "content": None, "tool_calls": [
        {"id": i["call_id"], "type": "function", "function": {"name": i["name"], "arguments": i["arguments"]}}
        for i in items if i["type"] == "function_call"]}
    msgs = [SYSTEM, {"role": "user", "content": "list files"}, echo,
            {"role": "tool", "tool_call_id": echo["tool_calls"][0]["id"], "content": "x"}]
    await http.post(CHAT.format(rid="lin-3"), json={"model": "m", "messages": msgs, "tools": [BASH], "seed": 7})
    c2 = calls(publisher)[-1]
    assert c2.parent_resolution_reason == "index_cold" and c2.request_fingerprint == c1.continuation_fingerprint
    assert c2.prompt_token_ids[: c1.cum_len] == c1.prompt_token_ids + c1.generation_token_ids


async def test_streaming_passes_chunks_through_and_captures_the_same_tokens(make_interceptor, publisher):
    http, _ = await make_interceptor()
    plain = await _turns(http, "st-plain", n_turns=1)
    streamed = await _turns(http, "st-stream", n_turns=1, stream=True)
    a, b = calls(publisher)
    assert a.generation_token_ids == b.generation_token_ids and a.generation_log_probs == b.generation_log_probs
    assert b.facts.streamed and not a.facts.streamed
    chunks = parse_sse(streamed[0].text)
    assert all("token_ids" not in ch for c in chunks for ch in c.get("choices", []))
    assert all(c.get("prompt_token_ids") is None and c["id"] == b.facts.response_id for c in chunks)
    assert json.loads(plain[0].text)["id"] == a.facts.response_id


async def test_openai_sdk_streams_through_the_interceptor(make_interceptor, publisher):
    http, _ = await make_interceptor()
    client = openai.AsyncOpenAI(base_url="http://tt/ng-rollout/sdk-1/training-token-capture/v1", api_key="x",
                                http_client=http, max_retries=0)
    stream = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                  stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    (call,) = calls(publisher)
    assert text and json.loads(call.output_items_json)[0]["content"][0]["text"] == text


async def test_the_terminal_event_waits_for_the_ack(make_interceptor, publisher):
    http, _ = await make_interceptor()
    publisher.gate = asyncio.Event()
    task = asyncio.create_task(http.post(CHAT.format(rid="st-gate"), json={
        "model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}))
    await asyncio.sleep(0.3)
    assert not task.done()
    publisher.gate.set()
    r = await task
    assert r.text.endswith("data: [DONE]\n\n") and len(calls(publisher)) == 1


async def test_a_stalled_stream_records_stream_interrupted(make_interceptor, publisher):
    http, _ = await make_interceptor({"stall_seconds": 0.2})
    r = await http.post(CHAT.format(rid="st-stall"), json={
        "model": "m", "messages": [{"role": "user", "content": "go [[fault:stall]]"}], "stream": True})
    assert "[DONE]" not in r.text and '"error"' in r.text
    (event,) = publisher.events
    assert isinstance(event.body, CallIncomplete) and event.body.reason == "stream_interrupted"


# Prefix supply (kv_transfer_params.prompt_token_ids, proven by the engine's prompt ids) is tested
# against a vLLM-shaped engine in test_prefix_supply.py.


async def test_engine_weight_version_is_recorded_per_call(make_interceptor, publisher):
    http, app = await make_interceptor({"weight_version": 3})
    await _turns(http, "wv-1", n_turns=1)
    assert calls(publisher)[0].facts.policy_version == "3"
    assert calls(publisher)[0].facts.policy_version_source == "engine"


async def test_admin_policy_version_is_used_when_the_engine_reports_none(interceptor, upstream, publisher):
    import httpx as _httpx

    from tests.unit.producers.conftest import vllm_chat_response

    r = await interceptor.post("/tokentrail/admin/policy-version", json={"version": "step-42"},
                               headers={"authorization": "Bearer s3cret"})
    assert r.status_code == 200
    upstream.responses.append(_httpx.Response(200, json=vllm_chat_response([1], [2])))
    await interceptor.post(CHAT.format(rid="adm"), json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert publisher.events[-1].body.facts.policy_version == "step-42"
    assert publisher.events[-1].body.facts.policy_version_source == "admin"


async def test_an_empty_admin_policy_version_is_a_400_naming_the_field(interceptor):
    # "" is the unknown version (a span the trainer must not learn from): refused, never a 5xx.
    r = await interceptor.post("/tokentrail/admin/policy-version", json={"version": ""},
                               headers={"authorization": "Bearer s3cret"})
    assert r.status_code == 400 and "'version'" in r.text and "non-empty" in r.text, r.text


@pytest.mark.parametrize("api", [("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                                 ("/v1/messages", {"max_tokens": 9, "messages": [{"role": "user", "content": "hi"}]})])
async def test_a_second_choice_in_the_stream_is_refused_not_dropped(interceptor, upstream, publisher, api):
    # One chunk reader for capture and translation (producers.dialects.chat_chunks): a second
    # choice cannot be captured as one call, in any dialect.
    path, body = api
    sse = (b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}],"prompt_token_ids":[1]}\n\n'
           b'data: {"choices":[{"index":0,"delta":{"content":"a"},"token_ids":[5]},'
           b'{"index":1,"delta":{"content":"b"},"token_ids":[6]}]}\n\n'
           b"data: [DONE]\n\n")
    upstream.responses.append(httpx.Response(200, content=sse, headers={"content-type": "text/event-stream"}))
    r = await interceptor.post(f"/ng-rollout/two/training-token-capture{path}",
                               json={"model": "x", "stream": True, **body})
    assert "[DONE]" not in r.text and "message_stop" not in r.text and "error" in r.text
    (marker,) = [e.body for e in publisher.events if isinstance(e.body, CallIncomplete)]
    assert marker.reason == "untranslatable_output" and "second choice" in marker.detail
    assert calls(publisher) == []
