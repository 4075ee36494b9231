"""A small external agent harness on the OpenAI Python SDK, for the demo and tests.

It behaves like the harnesses tokentrail serves: it owns its multi-turn loop,
echoes the assistant message and appends tool results, and returns text only.
It knows nothing about token ids; it only gets a per-rollout base URL.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

import openai

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}

ToolImpl = Callable[[str, dict[str, Any], int], str]


def weather_tool(name: str, arguments: dict[str, Any], n: int) -> str:
    return f"{arguments.get('city', 'somewhere')}: {14 + n} degrees and clear"


def failing_tool(fail_at: int) -> ToolImpl:
    """A tool whose ``fail_at``-th result makes the next model call fail upstream (a 5xx mid-rollout)."""

    def impl(name: str, arguments: dict[str, Any], n: int) -> str:
        if n == fail_at:
            return "tool output [[fault:5xx]]"
        return weather_tool(name, arguments, n)

    return impl


@dataclass
class Outcome:
    rollout_id: str
    final_text: str | None = None
    final_response_id: str | None = None
    calls: int = 0
    error: str | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    tool_results: list[str] = field(default_factory=list)
    response_ids: list[str] = field(default_factory=list)  # one per answered call, in order


async def run_rollout(
    base_url: str,
    rollout_id: str,
    task: str,
    *,
    tools: list[dict[str, Any]] = (WEATHER_TOOL,),  # type: ignore[assignment]
    tool_impl: ToolImpl = weather_tool,
    tool_calls: int = 2,
    model: str = "tokentrail-policy",
    max_turns: int = 10,
) -> Outcome:
    """Run one multi-turn, tool-using conversation; never raises (errors end the rollout)."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="not-needed", max_retries=0, timeout=60)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": f"You are a helpful agent. #tool-calls={tool_calls}"},
        {"role": "user", "content": task},
    ]
    outcome = Outcome(rollout_id, messages=messages)
    try:
        for _ in range(max_turns):
            response = await client.chat.completions.create(model=model, messages=messages, tools=list(tools))
            outcome.calls += 1
            outcome.response_ids.append(response.id)
            message = response.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                outcome.final_text = message.content
                outcome.final_response_id = response.id
                return outcome
            for call in message.tool_calls:
                result = tool_impl(call.function.name, json.loads(call.function.arguments or "{}"),
                                   len(outcome.tool_results))
                outcome.tool_results.append(result)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        outcome.error = f"no final answer after {max_turns} turns"
    except openai.APIError as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"
    finally:
        await client.close()
    return outcome
