"""The real OpenAI SDK (``client.responses``) against the Responses translation and the policy.

Multi-turn function calling with reasoning and function_call/function_call_output echoes,
streaming and not: the SDK parses everything, arguments round-trip, statuses are right,
streamed output equals non-streamed output, nothing token-shaped leaks, and the token chain
stays contiguous across the Responses echo.
"""

from __future__ import annotations

import json

import openai
import pytest

from producers.capture.events import request_items
from producers.dialects import responses as rdialect
from producers.engine.extract import chat_output_items
from schemas.hashing import assistant_fingerprint, conversation_digest

TOOLS = [
    {"type": "function", "name": "Read", "description": "Read a file", "strict": False,
     "parameters": {"type": "object", "properties": {"file_path": {"type": "string"}, "limit": {"type": "integer"}},
                    "required": ["file_path", "limit"]}},
    {"type": "function", "name": "Bash", "description": "Run a shell command — carefully", "strict": False,
     "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}},
    {"type": "web_search"},  # a hosted tool: never offered upstream
]
INSTRUCTIONS = "You are Codex, a careful agent. #tool-calls=2"


def sdk(bridge) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url="http://bridge/v1", api_key="x", http_client=bridge.client(), max_retries=0)


async def run_session(bridge, *, stream: bool, reasoning: bool) -> list:
    client = sdk(bridge)
    items: list[dict] = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Sandbox: read-only."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "List the files."}]},
    ]
    kwargs = dict(model="tokentrail-policy", instructions=INSTRUCTIONS, tools=TOOLS, store=False,
                  max_output_tokens=300, parallel_tool_calls=False, include=["reasoning.encrypted_content"],
                  prompt_cache_key="session-1")
    if reasoning:
        kwargs["reasoning"] = {"effort": "medium", "summary": "auto"}
    finals = []
    for _ in range(3):
        if stream:
            async with client.responses.stream(input=items, **kwargs) as s:
                async for _event in s:
                    pass
                final = await s.get_final_response()
        else:
            final = await client.responses.create(input=items, **kwargs)
        finals.append(final)
        items += [item.model_dump(exclude_none=True) for item in final.output]
        calls = [item for item in final.output if item.type == "function_call"]
        if not calls:
            break
        items += [{"type": "function_call_output", "call_id": c.call_id, "output": f"ran {c.name}\nok"} for c in calls]
    return finals


@pytest.mark.parametrize("reasoning", [False, True])
@pytest.mark.parametrize("stream", [False, True])
async def test_multi_turn_function_calls(make_bridge, stream, reasoning):
    bridge = make_bridge(reasoning=reasoning)
    finals = await run_session(bridge, stream=stream, reasoning=reasoning)
    assert len(finals) == 3 and all(f.status == "completed" for f in finals)
    for n, final in enumerate(finals[:2]):
        assert final.id == f"resp_call{n}" and final.model == "tokentrail-policy"
        (call,) = [item for item in final.output if item.type == "function_call"]
        assert call.name == "Bash" and json.loads(call.arguments) == {"command": f"echo tokentrail-{n + 1}"}
        assert call.id == f"fc_resp_call{n}_{1 if reasoning else 0}"
        assert not any(item.type == "message" for item in final.output)
    assert finals[-1].output_text.endswith(".")
    for final, call in zip(finals, bridge.calls):
        assert [item.type == "reasoning" for item in final.output][:1] == [reasoning]
        assert final.usage.input_tokens == len(call.prompt_ids)
        assert final.usage.output_tokens == len(call.gen_ids)
        assert final.instructions == INSTRUCTIONS and final.parallel_tool_calls is False
        assert [t["function"]["name"] for t in call.chat_request["tools"]] == ["Read", "Bash"]
        assert call.chat_request["messages"][:2] == [{"role": "system", "content": INSTRUCTIONS},
                                                     {"role": "system", "content": "Sandbox: read-only."}]
    bridge.assert_chain()
    bridge.assert_no_token_fields()


@pytest.mark.parametrize("reasoning", [False, True])
async def test_streamed_equals_non_streamed(make_bridge, reasoning):
    plain = await run_session(make_bridge(reasoning=reasoning), stream=False, reasoning=reasoning)
    streamed = await run_session(make_bridge(reasoning=reasoning), stream=True, reasoning=reasoning)

    def shape(response) -> list:
        # call ids are random per call (vLLM's too); everything else must match, item ids included
        dumped = [item.model_dump(exclude_none=True, exclude={"call_id"}) for item in response.output]
        return [dumped, response.status, response.usage, response.id]

    assert [shape(r) for r in plain] == [shape(r) for r in streamed]


async def test_lineage_hashes_link_across_the_echo(make_bridge):
    bridge = make_bridge(reasoning=True)
    await run_session(bridge, stream=False, reasoning=True)
    for before, after in zip(bridge.calls, bridge.calls[1:]):
        items_before, items_after = _items(before.body), _items(after.body)
        output, _ = chat_output_items(before.upstream["choices"][0]["message"])
        assert assistant_fingerprint(items_after) == assistant_fingerprint(items_before + output)
        assert conversation_digest(items_after[: len(items_before)]) == conversation_digest(items_before)


def _items(body: dict) -> list[dict]:
    items, instructions, tools = rdialect.hash_items(body)
    return request_items(items, instructions=instructions, tools=tools)


async def test_string_input_and_raw_event_stream(make_bridge):
    bridge = make_bridge(reasoning=True)
    client = sdk(bridge)
    plain = await client.responses.create(model="m", input="Say something.", reasoning={"effort": "low"})
    stream = await client.responses.create(model="m", input="Say something.", reasoning={"effort": "low"},
                                           stream=True)
    events = [event async for event in stream]
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "response.reasoning_text.delta" in kinds and "response.output_text.done" in kinds
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == plain.output_text
    assert events[-1].response.output_text == plain.output_text
    assert bridge.calls[0].chat_request["chat_template_kwargs"] == {"enable_thinking": True}


async def test_max_output_tokens_is_incomplete(make_bridge):
    client = sdk(make_bridge())
    plain = await client.responses.create(model="m", input="Hi", max_output_tokens=3)
    assert plain.status == "incomplete" and plain.incomplete_details.reason == "max_output_tokens"
    assert plain.output[-1].status == "incomplete" and plain.usage.output_tokens == 3
    stream = await client.responses.create(model="m", input="Hi", max_output_tokens=3, stream=True)
    events = [event async for event in stream]
    assert events[-1].type == "response.incomplete"  # what the OpenAI API sends
    assert events[-1].response.output_text == plain.output_text


async def test_stateful_request_is_a_clear_400(make_bridge):
    client = sdk(make_bridge())
    with pytest.raises(openai.BadRequestError) as info:
        await client.responses.create(model="m", input="Hi", previous_response_id="resp_1")
    assert "previous_response_id" in str(info.value) and "store=false" in str(info.value)
