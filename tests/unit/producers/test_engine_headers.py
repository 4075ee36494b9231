"""What crosses to the engine and back (issue 15 item 12): request headers from an allow-list, no vLLM-only
fields in the harness's answer."""

from __future__ import annotations

import json

import pytest
from pydantic import SecretStr
from starlette.datastructures import Headers

from producers.http.replies import FORWARDED_REQUEST_HEADERS, upstream_headers
from tests.unit.producers.fake_vllm import FakeVLLM

CHAT = "/ng-rollout/{rid}/training-token-capture/v1/chat/completions"
HELLO = [{"role": "user", "content": "hi"}]
NEVER = {"authorization": "Bearer sk-harness-real-key", "x-api-key": "sk-ant-harness", "cookie": "session=abc",
         "proxy-authorization": "Basic dTpw", "x-forwarded-for": "10.1.2.3", "x-forwarded-host": "internal",
         "forwarded": "for=10.1.2.3", "x-real-ip": "10.1.2.3", "openai-organization": "org-1",
         "x-stainless-os": "Linux", "x-harness-note": "anything", "x-data-parallel-rank": "3"}
ALLOWED = {"content-type": "application/json", "accept": "application/json", "user-agent": "claude-cli/2",
           "x-request-id": "req-1", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
           "tracestate": "a=b", "anthropic-version": "2023-06-01", "anthropic-beta": "tools-2024"}


def test_only_allow_listed_headers_go_to_the_engine():
    out = upstream_headers(Headers({**NEVER, **ALLOWED}), None)
    assert out == ALLOWED and set(ALLOWED) == FORWARDED_REQUEST_HEADERS


def test_the_engines_credential_is_upstream_api_key_alone():
    out = upstream_headers(Headers({**NEVER, **ALLOWED}), SecretStr("k-engine"))
    assert out["authorization"] == "Bearer k-engine" and "x-api-key" not in out
    assert set(out) == FORWARDED_REQUEST_HEADERS | {"authorization"}


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
async def test_through_the_interceptor_the_engine_never_sees_the_harness_credentials(over_engine, stream):
    engine = FakeVLLM()
    http, _ = await over_engine(engine)
    r = await http.post(CHAT.format(rid="h-1"), json={"model": "x", "messages": HELLO, "stream": stream},
                        headers=NEVER)
    assert r.status_code == 200, r.text
    assert (await http.get("/ng-rollout/h-1/v1/models", headers=NEVER)).status_code == 200  # forwarded routes too
    for request in engine.requests:
        assert not set(request["headers"]) & set(NEVER), request["headers"]


@pytest.mark.parametrize("logprobs", [False, True])
async def test_a_non_streaming_chat_answer_carries_no_vllm_only_field(over_engine, logprobs):
    engine = FakeVLLM(weight_version="step-7")
    http, _ = await over_engine(engine)
    r = await http.post(CHAT.format(rid="h-3"), json={"model": "x", "messages": HELLO, "logprobs": logprobs,
                                                      "return_token_ids": True, "return_weight_versions": True})
    assert r.status_code == 200, r.text
    body = r.json()
    (choice,) = body["choices"]
    assert engine.bodies()[0]["return_weight_versions"] is True  # asked upstream, for the capture
    for field in ("weight_versions", "token_ids", "routed_experts"):
        assert field not in choice, field
    for field in ("prompt_token_ids", "prompt_logprobs", "kv_transfer_params"):
        assert field not in body, field
    assert (choice["logprobs"] is not None) is logprobs
    assert "step-7" not in r.text


async def test_a_streamed_chat_answer_carries_no_vllm_only_field(over_engine):
    engine = FakeVLLM(weight_version="step-7")
    http, _ = await over_engine(engine)
    r = await http.post(CHAT.format(rid="h-4"), json={"model": "x", "messages": HELLO, "stream": True})
    chunks = [json.loads(line[5:]) for line in r.text.splitlines() if line.startswith("data: {")]
    assert chunks and "step-7" not in r.text
    for chunk in chunks:
        assert "prompt_token_ids" not in chunk
        for choice in chunk.get("choices", []):
            assert not {"weight_versions", "token_ids"} & set(choice)
