"""The interceptor's request path with a scripted engine and a recording publisher."""

from __future__ import annotations

import asyncio

import httpx

from schemas.hashing import compute_digest
from schemas.records import CallCaptured, CallIncomplete, ParentResolution, RolloutFinished
from tests.unit.producers.conftest import vllm_chat_response

CAPTURE = "/ng-rollout/r-1/training-token-capture/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "weather in Paris?"}]


async def test_capture_publishes_exact_tokens_and_strips_them_from_the_answer(interceptor, upstream, publisher):
    upstream.responses.append(httpx.Response(200, json=vllm_chat_response([1, 2, 3], [7, 8], "sunny")))
    r = await interceptor.post(CAPTURE, json={"model": "m", "messages": MESSAGES, "temperature": 0.2})
    assert r.status_code == 200
    body = r.json()
    assert "prompt_token_ids" not in body and "token_ids" not in body["choices"][0]
    assert body["choices"][0]["logprobs"] is None  # the harness did not ask for them
    assert body["choices"][0]["message"]["content"] == "sunny"
    sent = upstream.requests[0]
    assert sent["path"] == "/v1/chat/completions"
    assert sent["body"]["return_token_ids"] is True and sent["body"]["logprobs"] is True
    assert sent["body"]["top_logprobs"] == 0 and sent["body"]["include_reasoning"] is True
    assert sent["body"]["temperature"] == 1.0  # the sampling pin replaced the harness's 0.2
    (event,) = publisher.events
    call = event.body
    assert isinstance(call, CallCaptured) and event.rollout_id == "r-1"
    assert call.prompt_token_ids == [1, 2, 3] and call.generation_token_ids == [7, 8]
    assert call.generation_log_probs == [-0.25, -0.5]
    assert call.digest == compute_digest([1, 2, 3, 7, 8]) and call.cum_len == 5
    assert call.parent_resolution is ParentResolution.ROOT
    assert body["id"] == call.facts.response_id and call.model_call_id in body["id"]
    assert '"temperature":1.0' in call.facts.sampling_json


async def test_answer_waits_for_the_acknowledgement(interceptor, upstream, publisher):
    upstream.responses.append(httpx.Response(200, json=vllm_chat_response([1], [2])))
    publisher.gate = asyncio.Event()
    task = asyncio.create_task(interceptor.post(CAPTURE, json={"model": "m", "messages": MESSAGES}))
    await asyncio.sleep(0.2)
    assert not task.done() and publisher.events == []
    publisher.gate.set()
    assert (await task).status_code == 200 and len(publisher.events) == 1


async def test_no_success_without_durable_evidence(interceptor, upstream, publisher):
    upstream.responses.append(httpx.Response(200, json=vllm_chat_response([1], [2])))
    publisher.fail = True
    r = await interceptor.post(CAPTURE, json={"model": "m", "messages": MESSAGES})
    assert r.status_code == 503 and "durable" in r.json()["error"]["message"]


async def test_upstream_error_records_incomplete_and_returns_the_error(interceptor, upstream, publisher):
    upstream.responses.append(httpx.Response(500, json={"error": {"message": "boom"}}))
    r = await interceptor.post(CAPTURE, json={"model": "m", "messages": MESSAGES})
    assert r.status_code == 500
    (event,) = publisher.events
    assert isinstance(event.body, CallIncomplete) and event.body.reason == "upstream_error"
    assert event.body.http_status == 500


async def test_missing_token_ids_marks_incomplete_but_answers(interceptor, upstream, publisher):
    upstream.responses.append(httpx.Response(200, json=vllm_chat_response([1], [2], token_ids=False)))
    r = await interceptor.post(CAPTURE, json={"model": "m", "messages": MESSAGES})
    assert r.status_code == 200
    assert publisher.events[0].body.reason == "missing_token_ids"


async def test_partial_token_metadata_is_incomplete(interceptor, upstream, publisher):
    bad = vllm_chat_response([1], [2, 3])
    bad["choices"][0]["logprobs"]["content"].pop()
    upstream.responses.append(httpx.Response(200, json=bad))
    await interceptor.post(CAPTURE, json={"model": "m", "messages": MESSAGES})
    assert publisher.events[0].body.reason == "partial_token_metadata"


async def test_invalid_rollout_id_is_refused_naming_the_rule(interceptor, publisher):
    r = await interceptor.post("/ng-rollout/bad id!/training-token-capture/v1/chat/completions", json={})
    assert r.status_code == 400 and "must match" in r.json()["error"]["message"]
    assert publisher.events == []


async def test_eval_prefix_and_bare_paths_forward_without_capture(interceptor, upstream, publisher):
    upstream.responses.append(httpx.Response(200, json=vllm_chat_response([1], [2])))
    r = await interceptor.post("/ng-rollout/r-1/v1/chat/completions", json={"messages": MESSAGES})
    assert r.status_code == 200 and upstream.requests[-1]["path"] == "/v1/chat/completions"
    r = await interceptor.get("/v1/models")
    assert r.status_code == 200
    assert publisher.events == []
    assert "return_token_ids" not in upstream.requests[0]["body"]


async def test_non_generating_routes_under_the_capture_prefix_do_not_mask(interceptor, publisher):
    r = await interceptor.get("/ng-rollout/r-1/training-token-capture/v1/models")
    assert r.status_code == 200 and publisher.events == []


async def test_an_unknown_route_under_the_prefix_is_refused_and_records_nothing(interceptor, upstream, publisher):
    # Was: forwarded, and a 2xx recorded CallIncomplete(unknown_route), which let any caller mask any rollout
    # (issue 15 item 8). The route table (producers.http.route_policy) now refuses what it does not list.
    r = await interceptor.post("/ng-rollout/r-1/training-token-capture/v1/completions", json={"prompt": "x"})
    assert r.status_code == 404
    assert "POST /v1/completions" in r.json()["error"]["message"] and "route policy: refuse" in r.json()["error"]["message"]
    assert publisher.events == [] and upstream.requests == []


async def test_finish_route_needs_the_bearer_token(interceptor, publisher):
    r = await interceptor.post("/rollouts/r-1/finish", json={"result": {"reward": 1}})
    assert r.status_code == 401
    r = await interceptor.post("/rollouts/r-1/finish", json={"result": {"reward": 1}, "final_text": "done"},
                               headers={"authorization": "Bearer s3cret"})
    assert r.status_code == 200
    body = publisher.events[-1].body
    assert isinstance(body, RolloutFinished) and body.result == {"reward": 1} and body.final_text == "done"
    r = await interceptor.post("/ng-rollout/r-1/rollouts/r-1/finish", json={},
                               headers={"authorization": "Bearer s3cret"})
    assert len(publisher.events) == 1  # the control route is not reachable through the prefix


async def test_tool_call_output_items_hash_like_the_echo(interceptor, upstream, publisher):
    from schemas.hashing import assistant_fingerprint

    tool_calls = [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]
    upstream.responses.append(httpx.Response(200, json=vllm_chat_response([1, 2], [3, 4], None, tool_calls)))
    r = await interceptor.post(CAPTURE, json={"model": "m", "messages": MESSAGES, "tools": [{"type": "function", "function": {"name": "get_weather"}}]})
    echo = MESSAGES + [r.json()["choices"][0]["message"], {"role": "tool", "tool_call_id": "call_1", "content": "18C"}]
    call = publisher.events[0].body
    assert call.continuation_fingerprint == assistant_fingerprint(echo)
    assert call.facts.tools_present and call.facts.tool_schema_digest


def test_structured_logs_carry_the_call_identity_as_fields():
    import json as _json
    import logging

    from producers.logs import JsonFormatter

    record = logging.makeLogRecord({"msg": "call captured", "levelname": "INFO", "name": "tokentrail.interceptor",
                                    "rollout_id": "r-1", "model_call_id": "abc", "outcome": "captured"})
    line = _json.loads(JsonFormatter().format(record))
    assert line["rollout_id"] == "r-1" and line["model_call_id"] == "abc" and line["msg"] == "call captured"
