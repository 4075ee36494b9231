"""Test helpers for code that talks to the reference policy server.

Sample tool schemas, an SSE parser that checks vLLM's framing, and the faithful harness
echo (assistant message and tool results) that makes the next prompt extend the last.
Used by the policy server's own tests and usable by interceptor or demo tests.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

BASH = {
    "type": "function",
    "function": {
        "name": "Bash",
        "description": "Run a shell command",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
            "required": ["command"],
        },
    },
}
READ = {
    "type": "function",
    "function": {
        "name": "Read",
        "description": "Read a file",
        "parameters": {
            "type": "object",
            "properties": {
                "file_path": {"type": "string"},
                "limit": {"type": "integer"},
                "verbose": {"type": "boolean"},
                "mode": {"type": "string", "enum": ["text", "binary"]},
                "label": {"type": "string"},
            },
            "required": ["file_path", "limit", "verbose", "mode", "label"],
        },
    },
}
TOOLS = [READ, BASH]


def user_turn(text: str = "List the files in the work folder.") -> list[dict]:
    return [{"role": "system", "content": "You are a careful agent."}, {"role": "user", "content": text}]


def parse_sse(text: str) -> list[dict]:
    """The JSON chunks of an SSE body; asserts the vLLM framing and the final [DONE]."""
    events = [e for e in text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    out = []
    for event in events[:-1]:
        assert event.startswith("data: ")
        out.append(json.loads(event[len("data: "):]))
    return out


def echo(message: dict) -> dict:
    """The assistant message as a faithful harness sends it back."""
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        out["tool_calls"] = message["tool_calls"]
    if message.get("reasoning"):
        out["reasoning"] = message["reasoning"]
    return out


def tool_results(message: dict) -> list[dict]:
    return [
        {"role": "tool", "tool_call_id": call["id"], "content": f"ran {call['function']['name']}\nok"}
        for call in message.get("tool_calls") or ()
    ]


async def chat(client: httpx.AsyncClient, **body: Any) -> dict:
    response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


async def chat_stream(client: httpx.AsyncClient, **body: Any) -> list[dict]:
    response = await client.post("/v1/chat/completions", json={**body, "stream": True})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    return parse_sse(response.text)
