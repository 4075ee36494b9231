"""Responses ``namespace`` tools (Codex's ``multi_agent_v1`` sub-agent tools): offered to the model
under their bare names, answered with ``namespace`` on the function_call (Codex runs the call only
then), accepted back in the history, and the echo still links the next turn to its parent."""

from __future__ import annotations

import json

import httpx
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from producers.dialects import responses as rdialect
from producers.dialects.common import DialectError
from schemas.records import CallCaptured, ParentResolution

EVENTS = TypeAdapter(ResponseStreamEvent)
SPAWN = {"type": "function", "name": "spawn_agent", "description": "Spawn a sub-agent.", "strict": False,
         "parameters": {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}}
WAIT = {"type": "function", "name": "wait_agent", "strict": False,
        "parameters": {"type": "object", "properties": {"targets": {"type": "array"}}, "required": ["targets"]}}
EXEC = {"type": "function", "name": "exec_command", "strict": False,
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}
NAMESPACE = {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.",
             "tools": [SPAWN, WAIT]}
TOOLS = [EXEC, NAMESPACE]
REQUEST = {"model": "m", "input": "hi", "tools": TOOLS, "tool_choice": "auto", "store": False}


def chat_tool_names(body: dict) -> list[str]:
    return [t["function"]["name"] for t in rdialect.to_chat_request(body).get("tools", [])]


# -- request ------------------------------------------------------------------------------


def test_namespaced_function_tools_reach_the_model_under_their_bare_names():
    chat = rdialect.to_chat_request(REQUEST)
    assert [t["function"]["name"] for t in chat["tools"]] == ["exec_command", "spawn_agent", "wait_agent"]
    assert chat["tools"][1] == {"type": "function", "function": {
        "name": "spawn_agent", "description": "Spawn a sub-agent.", "parameters": SPAWN["parameters"],
        "strict": False}}
    assert chat["tool_choice"] == "auto"  # sent: function tools are offered


def test_a_namespace_alone_is_enough_to_offer_tools_and_its_hosted_tools_are_skipped():
    namespace = {**NAMESPACE, "tools": [SPAWN, {"type": "custom", "name": "grammar_tool"}, WAIT]}
    assert chat_tool_names({**REQUEST, "tools": [namespace]}) == ["spawn_agent", "wait_agent"]


@pytest.mark.parametrize("tools, field, name", [
    ([NAMESPACE, {**EXEC, "name": "spawn_agent"}], "'tools[1].name'", "spawn_agent"),
    ([{**EXEC, "name": "wait_agent"}, NAMESPACE], "'tools[1].tools[1].name'", "wait_agent"),
    ([NAMESPACE, {**NAMESPACE, "name": "other", "tools": [SPAWN]}], "'tools[1].tools[0].name'", "spawn_agent"),
    ([{**NAMESPACE, "tools": [SPAWN, SPAWN]}], "'tools[0].tools[1].name'", "spawn_agent"),
])
def test_a_bare_name_shared_with_a_namespaced_function_is_refused_naming_the_field(tools, field, name):
    with pytest.raises(DialectError, match="already defined") as error:
        rdialect.to_chat_request({**REQUEST, "tools": tools})
    assert f"{field} = {name!r}" in str(error.value)


def test_top_level_twins_still_pass_as_before():
    assert chat_tool_names({**REQUEST, "tools": [EXEC, EXEC]}) == ["exec_command", "exec_command"]


@pytest.mark.parametrize("tool, field", [
    ({"type": "namespace", "tools": [SPAWN]}, "'tools[0].name'"),
    ({"type": "namespace", "name": "ns", "tools": "spawn_agent"}, "'tools[0].tools'"),
    ({"type": "namespace", "name": "ns", "tools": [{"type": "function"}]}, "'tools[0].tools[0].name'"),
])
def test_a_malformed_namespace_is_refused_naming_the_field(tool, field):
    with pytest.raises(DialectError) as error:
        rdialect.to_chat_request({**REQUEST, "tools": [tool]})
    assert field in str(error.value)


def test_a_namespaced_function_call_in_the_history_becomes_a_bare_chat_tool_call():
    body = {**REQUEST, "input": [
        {"type": "message", "role": "user", "content": "go"},
        {"type": "function_call", "name": "spawn_agent", "namespace": "multi_agent_v1", "call_id": "c1",
         "arguments": '{"message": "m"}'},
        {"type": "function_call_output", "call_id": "c1", "output": '{"agent_id": "a"}'}]}
    messages = rdialect.to_chat_request(body)["messages"]
    assert messages[1] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "spawn_agent", "arguments": '{"message": "m"}'}}]}
    assert messages[2] == {"role": "tool", "tool_call_id": "c1", "content": '{"agent_id": "a"}'}


def test_a_non_string_namespace_on_a_history_call_is_refused_naming_the_field():
    body = {**REQUEST, "input": [{"type": "function_call", "name": "spawn_agent", "namespace": 3, "call_id": "c1",
                                  "arguments": "{}"}]}
    with pytest.raises(DialectError, match=r"'input\[0\]\.namespace' must be a string"):
        rdialect.to_chat_request(body)


@pytest.mark.parametrize("item, what", [
    # Multi-agent v2's items: out of scope, refused (400) naming the item, never dropped.
    ({"type": "agent_message", "author": "/root/w", "recipient": "/root",
      "content": [{"type": "input_text", "text": "done"}]}, "'agent_message'"),
    ({"type": "message", "role": "user",
      "content": [{"type": "encrypted_content", "encrypted_content": "run echo"}]}, "'encrypted_content'"),
])
def test_multi_agent_v2_items_are_refused_naming_the_item(item, what):
    with pytest.raises(DialectError) as error:
        rdialect.to_chat_request({**REQUEST, "input": [{"role": "user", "content": "hi"}, item]})
    assert "input[1]" in str(error.value) and what in str(error.value)


# -- answer -------------------------------------------------------------------------------


def completion(calls: list[tuple[str, str]]) -> dict:
    message = {"role": "assistant", "content": None, "reasoning": None, "refusal": None,
               "tool_calls": [{"id": f"call-{i}", "type": "function", "function": {"name": n, "arguments": a}}
                              for i, (n, a) in enumerate(calls)]}
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 7, "model": "policy",
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}}


def test_a_namespaced_call_is_answered_with_its_namespace_and_a_top_level_one_without():
    chat = completion([("spawn_agent", '{"message": "m"}'), ("exec_command", '{"cmd": "ls"}')])
    out = rdialect.from_chat_response(chat, response_id="resp_x", model="m", request=REQUEST)
    assert out["output"] == [
        {"type": "function_call", "id": "fc_resp_x_0", "call_id": "call-0", "name": "spawn_agent",
         "namespace": "multi_agent_v1", "arguments": '{"message": "m"}', "status": "completed"},
        {"type": "function_call", "id": "fc_resp_x_1", "call_id": "call-1", "name": "exec_command",
         "arguments": '{"cmd": "ls"}', "status": "completed"},
    ]
    response = Response.model_validate(out)  # the SDK's own model knows the field
    assert response.output[0].namespace == "multi_agent_v1" and response.output[1].namespace is None


def chunk(delta: dict, finish: str | None = None, **top) -> dict:
    return {"id": "c", "object": "chat.completion.chunk", "created": 7, "model": "p",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **top}


def test_a_streamed_namespaced_call_carries_its_namespace_in_added_done_and_the_final_response():
    translator = rdialect.StreamTranslator("resp_x", "m", REQUEST)
    chunks = [chunk({"role": "assistant", "content": ""}),
              chunk({"tool_calls": [{"index": 0, "id": "call-0", "type": "function",
                                     "function": {"name": "spawn_agent"}}]}),
              chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"message": "m"}'}}]}),
              chunk({"tool_calls": [{"index": 1, "id": "call-1", "type": "function",
                                     "function": {"name": "exec_command", "arguments": "{}"}}]}),
              chunk({}, "tool_calls"),
              {"id": "c", "object": "chat.completion.chunk", "created": 7, "model": "p", "choices": [],
               "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}}]
    fed = [event for c in chunks for event in translator.feed(c)]
    rest, terminal = translator.finish()
    events = [data for _, data in fed + rest + [terminal]]
    for event in events:
        EVENTS.validate_python(event)
    items = {kind: [e["item"] for e in events if e["type"] == f"response.output_item.{kind}"]
             for kind in ("added", "done")}
    assert [i.get("namespace") for i in items["added"]] == ["multi_agent_v1", None]
    assert [i.get("namespace") for i in items["done"]] == ["multi_agent_v1", None]
    assert "namespace" not in items["added"][1] and "namespace" not in items["done"][1]
    assert items["done"][0]["arguments"] == '{"message": "m"}'
    assert terminal[1]["response"]["output"] == items["done"]
    non_streamed = rdialect.from_chat_response(
        completion([("spawn_agent", '{"message": "m"}'), ("exec_command", "{}")]), response_id="resp_x",
        model="m", request=REQUEST)
    assert terminal[1]["response"]["output"] == non_streamed["output"]


# -- through the interceptor: the echo links to its parent ----------------------------------


@pytest.fixture
async def client(make_interceptor):
    http, _ = await make_interceptor(upstream_model="tokentrail-policy")
    return http


async def respond(client: httpx.AsyncClient, rollout: str, body: dict) -> tuple[int, dict]:
    r = await client.post(f"/ng-rollout/{rollout}/training-token-capture/v1/responses", json=body)
    if not body.get("stream") or r.status_code != 200:
        return r.status_code, r.json()
    terminal = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")][-1]
    assert terminal["type"] == "response.completed", terminal
    return r.status_code, terminal["response"]


@pytest.mark.parametrize("stream", [False, True])
async def test_the_echoed_namespaced_call_links_the_next_turn_to_its_parent(client, publisher, stream):
    rollout = f"ns-{stream}"
    base = {"model": "m", "instructions": "Delegate. #tool=spawn_agent #tool-calls=1", "tools": TOOLS,
            "tool_choice": "auto", "store": False, "stream": stream}
    items: list = [{"type": "message", "role": "user", "content": "Spawn a helper."}]
    status, first = await respond(client, rollout, {**base, "input": items})
    assert status == 200, first
    (call,) = [o for o in first["output"] if o["type"] == "function_call"]
    assert (call["name"], call["namespace"]) == ("spawn_agent", "multi_agent_v1")
    # The harness echoes the call as it got it (namespace included) with the tool's output.
    items += [o for o in first["output"] if o["type"] in ("message", "function_call")]
    # (an output without an agent id: one with it makes the reference policy wait on that agent)
    items.append({"type": "function_call_output", "call_id": call["call_id"], "output": "spawned"})
    status, second = await respond(client, rollout, {**base, "input": items})
    assert status == 200, second
    assert [o["type"] for o in second["output"]] == ["message"]  # K=1 reached: the final answer
    calls = [e.body for e in publisher.events if isinstance(e.body, CallCaptured)]
    assert len(calls) == 2 and calls[0].parent_resolution is ParentResolution.ROOT
    assert calls[1].parent_resolution is ParentResolution.RESOLVED, calls[1].parent_resolution_reason
    assert calls[1].parent_call_id == calls[0].model_call_id and calls[1].prompt_is_delta


async def test_a_multi_agent_v2_item_is_a_400_naming_it_not_a_500(client):
    body = {**REQUEST, "input": [{"type": "agent_message", "author": "/root/w", "recipient": "/root",
                                  "content": [{"type": "input_text", "text": "done"}]}]}
    status, answer = await respond(client, "ns-v2", body)
    assert status == 400 and "input[0]" in answer["error"]["message"], answer
    assert "agent_message" in answer["error"]["message"]


async def test_a_name_collision_is_a_400_naming_the_field(client):
    clash = {**REQUEST, "tools": [NAMESPACE, {**EXEC, "name": "wait_agent"}]}
    status, answer = await respond(client, "ns-clash", clash)
    assert status == 400 and "'tools[1].name'" in answer["error"]["message"], answer
