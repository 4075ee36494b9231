"""The reference policy's rules for Codex's multi_agent_v1 tools (compose/engines/policy/multi_agent.py),
through the scripted decision every engine path uses."""

from __future__ import annotations

import json

import numpy as np

from compose.engines.policy import multi_agent
from compose.engines.policy.script import decide_tool_calls


def _tool(name: str, properties: dict, required: list[str] | None = None) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": properties, **({"required": required} if required else {})}}}


TOOLS = [
    _tool("exec_command", {"cmd": {"type": "string"}}, ["cmd"]),
    _tool("spawn_agent", {"message": {"type": "string"}, "items": {"type": "array"}}),  # nothing required
    _tool("wait_agent", {"targets": {"type": "array"}}, ["targets"]),
]


def _decide(messages, tools=TOOLS):
    return decide_tool_calls(messages, tools, None, 2, np.random.default_rng(0))


def test_a_spawn_carries_the_childs_task_though_its_schema_requires_nothing():
    calls = _decide([{"role": "user", "content": "Delegate. #tool=spawn_agent #tool-calls=1"}])
    assert [c.name for c in calls] == ["spawn_agent"]
    assert json.loads(calls[0].arguments) == {"message": multi_agent.CHILD_TASK}


def test_the_spawns_answer_is_followed_by_a_wait_on_its_agent_id():
    messages = [{"role": "user", "content": "Delegate. #tool=spawn_agent #tool-calls=1"},
                {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                                      "function": {"name": "spawn_agent", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": json.dumps({"agent_id": "a-1", "nickname": "x"})}]
    calls = _decide(messages)
    assert [(c.name, json.loads(c.arguments)["targets"]) for c in calls] == [("wait_agent", ["a-1"])]


def test_the_subagent_notification_turn_is_answered_not_delegated_again():
    messages = [{"role": "user", "content": "Delegate. #tool=spawn_agent #tool-calls=1"},
                {"role": "assistant", "content": "done"},
                {"role": "user", "content": "<subagent_notification>{\"agent_id\": \"a-1\"}</subagent_notification>"}]
    assert _decide(messages) == []


def test_conversations_without_the_multi_agent_tools_are_scripted_as_before():
    plain = [_tool("exec_command", {"cmd": {"type": "string"}}, ["cmd"])]
    messages = [{"role": "user", "content": "go"},
                {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                                      "function": {"name": "exec_command", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": json.dumps({"agent_id": "a-1"})}]
    assert [c.name for c in _decide(messages, plain)] == ["exec_command"]  # the second of the default two
    assert multi_agent.decide(messages, {"exec_command"}) is None
