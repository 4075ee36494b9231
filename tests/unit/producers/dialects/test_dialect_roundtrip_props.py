"""Properties: tool arguments survive the Anthropic echo byte for byte; any chunking streams
to the same answer as the non-streaming response (both dialects)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from producers.dialects import anthropic as adialect
from producers.dialects import responses as rdialect

JSON_SCALARS = st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=8) | st.floats(
    allow_nan=False, allow_infinity=False, width=32)
JSON = st.recursive(JSON_SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.text(max_size=5), inner, max_size=3), max_leaves=10)
ARGS = st.dictionaries(st.text(max_size=6), JSON, max_size=4)


@settings(max_examples=200, deadline=None)
@given(ARGS)
def test_anthropic_echo_reproduces_the_generated_arguments(args):
    generated = json.dumps(args, ensure_ascii=False)  # how vLLM's parsers (and the policy) write them
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": generated}}
    message = adialect.from_chat_response({"choices": [{"message": {"content": None, "tool_calls": [call]},
                                                        "finish_reason": "tool_calls"}]},
                                          response_id="m", model="m")
    echoed = json.loads(json.dumps(message["content"]))  # over the wire and back, as a harness does
    chat = adialect.to_chat_request({"messages": [{"role": "user", "content": "x"},
                                                  {"role": "assistant", "content": echoed}]})
    assert chat["messages"][1]["tool_calls"][0]["function"]["arguments"] == generated


def _chunks(reasoning: str, content: str, arguments: str, cuts: list[int]) -> list[dict]:
    def pieces(text: str) -> list[str]:
        bounds = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
        return [text[a:b] for a, b in zip(bounds, bounds[1:])]

    deltas: list[dict] = [{"role": "assistant", "content": ""}]
    deltas += [{"reasoning": p} for p in pieces(reasoning)]
    deltas += [{"content": p} for p in pieces(content)]
    deltas.append({"tool_calls": [{"index": 0, "id": "c1", "type": "function", "function": {"name": "f"}}]})
    deltas += [{"tool_calls": [{"index": 0, "function": {"arguments": p}}]} for p in pieces(arguments)]
    chunks = [{"created": 1, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    chunks.append({"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 9}})
    return chunks


TEXT = st.text(min_size=1, max_size=20)
CUTS = st.lists(st.integers(0, 40), max_size=6)


@settings(max_examples=100, deadline=None)
@given(TEXT, TEXT, ARGS, CUTS)
def test_any_chunking_streams_to_the_non_streaming_answer(reasoning, content, args, cuts):
    arguments = json.dumps(args, ensure_ascii=False)
    chunks = _chunks(reasoning, content, arguments, cuts)
    message = {"reasoning": reasoning, "content": content, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}]}
    chat = {"created": 1, "choices": [{"message": message, "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 4, "completion_tokens": 9}}

    translator = adialect.StreamTranslator("m", "m")
    events = [e for c in chunks for e in translator.feed(c)]
    rest, _ = translator.finish()
    blocks: list[dict] = []
    for name, data in events + rest:
        if name == "content_block_start":
            blocks.append(dict(data["content_block"], _json=""))
        elif name == "content_block_delta":
            delta, block = data["delta"], blocks[data["index"]]
            for field in ("text", "thinking"):
                if field in delta:
                    block[field] += delta[field]
            block["_json"] += delta.get("partial_json", "")
    for block in blocks:
        if block["type"] == "tool_use":
            block["input"] = json.loads(block["_json"])
        del block["_json"]
    assert blocks == adialect.from_chat_response(chat, response_id="m", model="m")["content"]

    request = {"input": "x"}
    translator = rdialect.StreamTranslator("r", "m", request)
    for chunk in chunks:
        translator.feed(chunk)
    _, (_, terminal) = translator.finish()
    assert terminal["response"] == rdialect.from_chat_response(chat, response_id="r", model="m", request=request)
