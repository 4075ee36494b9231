"""A small external agent harness on the OpenAI Python SDK, for the demo and tests.

It behaves like the harnesses tokentrail serves: it owns its multi-turn loop,
echoes the assistant message and appends tool results, and returns text only.
It knows nothing about token ids; it only gets a per-rollout base URL.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import openai

WEATHER_TOOL: dict[str, Any] = {
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


def overflowing_tool(fail_at: int, words: int = 40_000) -> ToolImpl:
    """A tool whose ``fail_at``-th result overflows the engine's context: a real engine refuses the next call (4xx)."""

    def impl(name: str, arguments: dict[str, Any], n: int) -> str:
        if n == fail_at:
            return "x " * words
        return weather_tool(name, arguments, n)

    return impl


def fault_tool(engine: str, fail_at: int) -> ToolImpl:
    """The mid-rollout engine failure each engine can be made to show: a 5xx (reference) or a refusal (vLLM)."""
    return failing_tool(fail_at) if engine == "reference" else overflowing_tool(fail_at)


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
    timed_out: bool = False  # the error was a call's deadline
    turns_exhausted: bool = False  # max_turns model calls, none of them final


async def run_rollout(  # OpenAI chat completions
    base_url: str,
    rollout_id: str,
    task: str,
    *,
    tools: Sequence[dict[str, Any]] = (WEATHER_TOOL,),
    tool_impl: ToolImpl = weather_tool,
    tool_calls: int = 2,
    model: str = "tokentrail-policy",
    max_turns: int = 10,
    stream: bool = False,
    system: str | None = None,
    api_key: str = "not-needed",
    timeout: float = 60,
    seed: int | None = None,
) -> Outcome:
    """Run one multi-turn, tool-using conversation; never raises (errors end the rollout).

    ``system`` replaces the default system message (which carries the reference server's
    ``#tool-calls`` directive); ``timeout`` bounds each call; ``seed`` is sent with every call (the
    reference server otherwise seeds from the prompt, so rollouts of one task would all be alike).
    """
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system if system is not None else f"You are a helpful agent. #tool-calls={tool_calls}"},
        {"role": "user", "content": task},
    ]
    outcome = Outcome(rollout_id, messages=messages)
    try:
        for _ in range(max_turns):
            # Plain JSON dicts, as a harness sends them (the SDK's TypedDicts describe the same shapes).
            params: dict[str, Any] = dict(model=model, messages=messages, tools=list(tools))
            if seed is not None:
                params["seed"] = seed
            if stream:
                async with client.chat.completions.stream(**params) as s:
                    response = await s.get_final_completion()
            else:
                response = await client.chat.completions.create(**params)
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
        outcome.turns_exhausted = True
    except openai.APIError as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"
        outcome.timed_out = isinstance(exc, openai.APITimeoutError)
    finally:
        await client.close()
    return outcome


async def run_anthropic_rollout(
    base_url: str, rollout_id: str, task: str, *, stream: bool = False, tool_calls: int = 2,
    model: str = "claude-opus-5-5", max_turns: int = 10, tools: list[dict[str, Any]] | None = None,
    tool_impl: ToolImpl = weather_tool, system: str | None = None, api_key: str = "not-needed",
    timeout: float = 60,
) -> Outcome:
    """The same loop over Anthropic Messages (the Claude Code wire format), via the Anthropic SDK.

    ``tools`` are Anthropic tool definitions (default: the weather tool), run by ``tool_impl``.
    """
    import anthropic

    client = anthropic.AsyncAnthropic(base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout)
    offered = tools if tools is not None else [{"name": "get_weather", "description": "Current weather for a city",
                                                "input_schema": WEATHER_TOOL["function"]["parameters"]}]
    system_blocks = [{"type": "text", "text": system if system is not None else
                      f"You are a helpful agent. #tool-calls={tool_calls}", "cache_control": {"type": "ephemeral"}}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": task}]}]
    outcome = Outcome(rollout_id, messages=messages)
    try:
        for _ in range(max_turns):
            kwargs: dict[str, Any] = dict(model=model, max_tokens=512, system=system_blocks, tools=offered,
                                          messages=messages)
            if stream:
                async with client.messages.stream(**kwargs) as s:
                    final = await s.get_final_message()
            else:
                final = await client.messages.create(**kwargs)
            outcome.calls += 1
            outcome.response_ids.append(final.id)
            messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]})
            uses = [b for b in final.content if b.type == "tool_use"]
            if not uses:
                outcome.final_text = "".join(b.text for b in final.content if b.type == "text")
                outcome.final_response_id = final.id
                return outcome
            results = []
            for use in uses:
                result = tool_impl(use.name, dict(use.input), len(outcome.tool_results))
                outcome.tool_results.append(result)
                results.append({"type": "tool_result", "tool_use_id": use.id, "content": result})
            messages.append({"role": "user", "content": results})
        outcome.error = f"no final answer after {max_turns} turns"
        outcome.turns_exhausted = True
    except anthropic.APIError as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"
        outcome.timed_out = isinstance(exc, anthropic.APITimeoutError)
    finally:
        await client.close()
    return outcome


async def run_responses_rollout(
    base_url: str, rollout_id: str, task: str, *, stream: bool = False, tool_calls: int = 2,
    model: str = "gpt-5-codex", max_turns: int = 10,
) -> Outcome:
    """The same loop over the OpenAI Responses API (the Codex wire format), stateless (store=False)."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="not-needed", max_retries=0, timeout=60)
    tool = {"type": "function", **{k: v for k, v in WEATHER_TOOL["function"].items()}}
    items: list[Any] = [{"role": "user", "content": task}]
    outcome = Outcome(rollout_id, messages=items)
    try:
        for _ in range(max_turns):
            kwargs: dict[str, Any] = dict(model=model,
                                          instructions=f"You are a helpful agent. #tool-calls={tool_calls}",
                                          input=items, tools=[tool], store=False)
            if stream:
                async with client.responses.stream(**kwargs) as s:
                    final = await s.get_final_response()
            else:
                final = await client.responses.create(**kwargs)
            outcome.calls += 1
            outcome.response_ids.append(final.id)
            items += [o.model_dump(exclude_none=True) for o in final.output if o.type in ("message", "function_call")]
            calls = [o for o in final.output if o.type == "function_call"]
            if not calls:
                outcome.final_text = final.output_text
                outcome.final_response_id = final.id
                return outcome
            for call in calls:
                result = weather_tool(call.name, json.loads(call.arguments or "{}"), len(outcome.tool_results))
                outcome.tool_results.append(result)
                items.append({"type": "function_call_output", "call_id": call.call_id, "output": result})
        outcome.error = f"no final answer after {max_turns} turns"
    except openai.APIError as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"
    finally:
        await client.close()
    return outcome
