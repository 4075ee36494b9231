"""The real Anthropic SDK against the Anthropic translation in front of the reference policy.

Multi-turn tool use, streaming and not: the SDK parses everything, tool inputs round-trip,
stop reasons are right, streamed output equals non-streamed output, nothing token-shaped
leaks, and the token chain stays contiguous across the Anthropic echo.
"""

from __future__ import annotations

import anthropic
import pytest

from producers.capture.events import request_items
from producers.dialects import anthropic as adialect
from producers.engine.extract import chat_output_items
from schemas.hashing import assistant_fingerprint, conversation_digest

TOOLS = [
    {"name": "Read", "description": "Read a file", "cache_control": {"type": "ephemeral"},
     "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}, "limit": {"type": "integer"}},
                      "required": ["file_path", "limit"]}},
    {"name": "Bash", "description": "Run a shell command — carefully",
     "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}},
    {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},  # a server tool: never offered upstream
]
SYSTEM = [{"type": "text", "text": "You are Claude Code, a careful agent."},
          {"type": "text", "text": "Work step by step. #tool-calls=2", "cache_control": {"type": "ephemeral"}}]


def sdk(bridge) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url="http://bridge", api_key="x", http_client=bridge.client2())


def with_breakpoint(messages: list[dict]) -> list[dict]:
    """Claude Code's habit: a cache_control breakpoint on the last block of the last message only."""
    out = []
    for i, message in enumerate(messages):
        content = message["content"]
        if isinstance(content, list):
            content = [{k: v for k, v in b.items() if k != "cache_control"} for b in content]
            if i == len(messages) - 1:
                content[-1] = {**content[-1], "cache_control": {"type": "ephemeral"}}
        out.append({**message, "content": content})
    return out


def tool_results(message, reminder: bool) -> dict:
    blocks = []
    for n, block in enumerate(b for b in message.content if b.type == "tool_use"):
        # string content, and a list of text blocks with is_error, as Claude Code sends both
        content = f"ran {block.name}\nok" if n % 2 == 0 else [{"type": "text", "text": "boom"}]
        blocks.append({"type": "tool_result", "tool_use_id": block.id, "content": content, "is_error": n % 2 == 1})
    if reminder:  # text after the results: a user turn, so the policy's tool count restarts
        blocks.append({"type": "text", "text": "<system-reminder>keep going</system-reminder>"})
    return {"role": "user", "content": blocks}


async def run_session(bridge, *, stream: bool, reasoning: bool) -> list:
    client = sdk(bridge)
    messages: list[dict] = [{"role": "user", "content": [{"type": "text", "text": "List the files."}]}]
    kwargs = dict(model="tokentrail-policy", max_tokens=300, system=SYSTEM, tools=TOOLS, metadata={"user_id": "u1"})
    if reasoning:
        kwargs["thinking"] = {"type": "enabled", "budget_tokens": 1024}
    finals = []
    for turn in range(4):
        if stream:
            async with client.messages.stream(messages=with_breakpoint(messages), **kwargs) as s:
                async for _event in s:
                    pass
                final = await s.get_final_message()
        else:
            final = await client.messages.create(messages=with_breakpoint(messages), **kwargs)
        finals.append(final)
        messages.append({"role": "assistant", "content": [b.model_dump() for b in final.content]})
        if final.stop_reason != "tool_use":
            break
        messages.append(tool_results(final, reminder=turn == 0))
    return finals


@pytest.mark.parametrize("reasoning", [False, True])
@pytest.mark.parametrize("stream", [False, True])
async def test_multi_turn_tool_use(make_bridge, stream, reasoning):
    bridge = make_bridge(reasoning=reasoning)
    finals = await run_session(bridge, stream=stream, reasoning=reasoning)
    assert [f.stop_reason for f in finals] == ["tool_use", "tool_use", "tool_use", "end_turn"]
    for n, final in enumerate(finals[:3]):
        assert final.id == f"msg_call{n}" and final.model == "tokentrail-policy"
        (call,) = [b for b in final.content if b.type == "tool_use"]
        assert call.name == "Bash" and call.input == {"command": f"echo tokentrail-{max(n, 1)}"}
        assert not any(b.type == "text" for b in final.content)
    text = [b for b in finals[-1].content if b.type == "text"]
    assert len(text) == 1 and text[0].text.endswith(".")
    for final, call in zip(finals, bridge.calls):
        assert [b.type == "thinking" for b in final.content][:1] == [reasoning]
        assert final.usage.input_tokens == len(call.prompt_ids)
        assert final.usage.output_tokens == len(call.gen_ids)
        assert call.chat_request["tools"][1]["function"]["name"] == "Bash"
        assert len(call.chat_request["tools"]) == 2  # the server tool was not offered
    bridge.assert_chain()
    bridge.assert_no_token_fields()


@pytest.mark.parametrize("reasoning", [False, True])
async def test_streamed_equals_non_streamed(make_bridge, reasoning):
    plain = await run_session(make_bridge(reasoning=reasoning), stream=False, reasoning=reasoning)
    streamed = await run_session(make_bridge(reasoning=reasoning), stream=True, reasoning=reasoning)

    def shape(message) -> list:
        # tool-call ids are random per call (vLLM's too); everything else must match
        return [(b.type, getattr(b, "text", None), getattr(b, "thinking", None), getattr(b, "name", None),
                 getattr(b, "input", None)) for b in message.content] + [message.stop_reason, message.usage]

    assert [shape(m) for m in plain] == [shape(m) for m in streamed]


async def test_lineage_hashes_link_across_the_echo(make_bridge):
    bridge = make_bridge(reasoning=True)
    await run_session(bridge, stream=False, reasoning=True)
    for before, after in zip(bridge.calls, bridge.calls[1:]):
        items_before, items_after = _items(before.body), _items(after.body)
        output, _ = chat_output_items(before.upstream["choices"][0]["message"])
        assert assistant_fingerprint(items_after) == assistant_fingerprint(items_before + output)
        assert conversation_digest(items_after[: len(items_before)]) == conversation_digest(items_before)


def _items(body: dict) -> list[dict]:
    """What the interceptor hashes: the envelope pseudo-turn + the items."""
    items, instructions, tools = adialect.hash_items(body)
    return request_items(items, instructions=instructions, tools=tools)


async def test_tokenize_renders_the_translated_request_like_the_engine(make_bridge):
    bridge = make_bridge()
    await run_session(bridge, stream=False, reasoning=False)
    last = bridge.calls[-1]
    rendered = await bridge.policy.post("/tokenize", json={"messages": last.chat_request["messages"],
                                                           "tools": last.chat_request["tools"]})
    assert rendered.json()["tokens"] == last.prompt_ids


async def test_raw_event_stream_and_stop_sequence(make_bridge):
    bridge = make_bridge()
    client = sdk(bridge)
    plain = await client.messages.create(model="m", max_tokens=60, messages=[{"role": "user", "content": "Say it."}])
    assert plain.stop_reason == "end_turn"
    words = plain.content[0].text.split()
    stop = " " + words[2]
    stream = await client.messages.create(model="m", max_tokens=60, stream=True, stop_sequences=[stop],
                                          messages=[{"role": "user", "content": "Say it."}])
    events = [event async for event in stream]
    kinds = [e.type for e in events]
    assert kinds[:2] == ["message_start", "content_block_start"] and kinds[-2:] == ["message_delta", "message_stop"]
    delta = events[-2]
    assert delta.delta.stop_reason == "stop_sequence" and delta.delta.stop_sequence == stop
    streamed = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert plain.content[0].text.startswith(streamed) and stop not in streamed


async def test_max_tokens_stop_reason(make_bridge):
    client = sdk(make_bridge())
    request = dict(model="m", max_tokens=3, messages=[{"role": "user", "content": "Hi"}])
    for stream in (False, True):
        if stream:
            async with client.messages.stream(**request) as s:
                final = await s.get_final_message()
        else:
            final = await client.messages.create(**request)
        assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 3


async def test_untranslatable_request_is_a_clear_400(make_bridge):
    client = sdk(make_bridge())
    document = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}
    with pytest.raises(anthropic.BadRequestError) as info:
        await client.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": [document]}])
    assert "document" in str(info.value)
