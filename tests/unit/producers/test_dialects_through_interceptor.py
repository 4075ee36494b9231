"""Anthropic Messages and OpenAI Responses through the interceptor, with the real SDKs, streaming
and not: every call captured with exact tokens, parents resolved across the dialect's own echo,
deltas stored, response ids naming the calls, no token field reaching the client."""

from __future__ import annotations

import anthropic
import httpx
import httpx2
import openai
import pytest

from schemas.ids import call_id_from_response_id
from schemas.records import CallCaptured, Dialect, ParentResolution
from tests.unit.producers.conftest import captured

BASH = {"name": "Bash", "description": "Run a shell command",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}
RESP_BASH = {"type": "function", "name": "Bash", "description": "Run a shell command",
             "parameters": BASH["input_schema"]}


def assert_chain(calls: list[CallCaptured], dialect: Dialect) -> None:
    assert len(calls) == 3
    assert calls[0].parent_resolution is ParentResolution.ROOT
    for parent, child in zip(calls, calls[1:]):
        assert child.parent_resolution is ParentResolution.RESOLVED, child.parent_resolution_reason
        assert child.parent_call_id == parent.model_call_id and child.prompt_is_delta
    assert all(c.facts.dialect is dialect and c.facts.requested_model == "claude-sonnet-x" for c in calls)
    assert all(c.facts.served_model == "tokentrail-policy" for c in calls)


@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic_sdk_multi_turn_tool_use(policy_app, publisher, stream):
    client = anthropic.AsyncAnthropic(
        base_url=f"http://tt/ng-rollout/anth-{stream}/training-token-capture", api_key="x", max_retries=0,
        http_client=httpx2.AsyncClient(transport=httpx2.ASGITransport(app=policy_app), base_url="http://tt"))
    system = [{"type": "text", "text": "You are an agent. #tool-calls=2", "cache_control": {"type": "ephemeral"}}]
    messages: list[dict] = [{"role": "user", "content": "List the files."}]
    ids = []
    for _ in range(4):
        kwargs = dict(model="claude-sonnet-x", max_tokens=300, system=system, tools=[BASH], messages=messages)
        if stream:
            async with client.messages.stream(**kwargs) as s:
                final = await s.get_final_message()
        else:
            final = await client.messages.create(**kwargs)
        ids.append(final.id)
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]})
        if final.stop_reason != "tool_use":
            break
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": b.id, "content": "a.txt b.txt"}
            for b in final.content if b.type == "tool_use"]})
    calls = captured(publisher)
    assert_chain(calls, Dialect.ANTHROPIC_MESSAGES)
    assert [call_id_from_response_id(i) for i in ids] == [c.model_call_id for c in calls]
    assert all(c.facts.streamed is stream for c in calls)


@pytest.mark.parametrize("stream", [False, True])
async def test_openai_responses_sdk_multi_turn_tool_use(policy_app, publisher, stream):
    client = openai.AsyncOpenAI(base_url=f"http://tt/ng-rollout/resp-{stream}/training-token-capture/v1",
                                api_key="x", max_retries=0,
                                http_client=httpx.AsyncClient(transport=httpx.ASGITransport(app=policy_app)))
    items: list = [{"role": "user", "content": "List the files."}]
    for _ in range(4):
        kwargs = dict(model="claude-sonnet-x", instructions="You are an agent. #tool-calls=2", input=items,
                      tools=[RESP_BASH], store=False)
        if stream:
            async with client.responses.stream(**kwargs) as s:
                final = await s.get_final_response()
        else:
            final = await client.responses.create(**kwargs)
        calls_out = [o for o in final.output if o.type == "function_call"]
        items += [o.model_dump(exclude_none=True) for o in final.output if o.type in ("message", "function_call")]
        if not calls_out:
            break
        items += [{"type": "function_call_output", "call_id": c.call_id, "output": "a.txt b.txt"} for c in calls_out]
    calls = captured(publisher)
    assert_chain(calls, Dialect.RESPONSES)
    assert call_id_from_response_id(final.id) == calls[-1].model_call_id


async def test_anthropic_bad_request_is_a_400_in_anthropic_shape(policy_app, publisher):
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=policy_app), base_url="http://tt") as http:
        r = await http.post("/ng-rollout/a-bad/training-token-capture/v1/messages",
                            json={"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "mystery"}]}]})
    assert r.status_code == 400 and r.json()["type"] == "error" and "mystery" in r.json()["error"]["message"]
    assert publisher.events == []
