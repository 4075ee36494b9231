"""vLLM chat completion / chunks -> Anthropic Message / SSE events (unit level)."""

from __future__ import annotations

import json

import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from producers.dialects import anthropic as adialect
from producers.dialects.common import DialectError

EVENTS = TypeAdapter(RawMessageStreamEvent)


def vllm_completion(message: dict, finish_reason: str = "stop", stop_reason=None) -> dict:
    """vLLM 0.33's non-streaming shape, token fields included."""
    full = {"role": "assistant", "content": None, "refusal": None, "annotations": None, "audio": None,
            "function_call": None, "reasoning": None, **message}
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 7, "model": "policy",
            "choices": [{"index": 0, "message": full,
                         "logprobs": {"content": [{"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": []}]},
                         "finish_reason": finish_reason, "stop_reason": stop_reason, "token_ids": [5, 6, 7],
                         "routed_experts": None}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14},
            "prompt_token_ids": list(range(11)), "prompt_logprobs": None, "kv_transfer_params": None}


CALL = {"id": "chatcmpl-tool-9", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "ls"}'}}


def test_full_message():
    chat = vllm_completion({"content": "Hi.", "reasoning": " hmm", "tool_calls": [CALL]}, "tool_calls")
    out = adialect.from_chat_response(chat, response_id="msg_x", model="claude-x")
    assert out == {
        "id": "msg_x", "type": "message", "role": "assistant", "model": "claude-x",
        "content": [{"type": "thinking", "thinking": " hmm", "signature": ""},
                    {"type": "text", "text": "Hi."},
                    {"type": "tool_use", "id": "chatcmpl-tool-9", "name": "Bash", "input": {"command": "ls"}}],
        "stop_reason": "tool_use", "stop_sequence": None,
        "usage": {"input_tokens": 11, "output_tokens": 3, "cache_creation_input_tokens": 0,
                  "cache_read_input_tokens": 0},
    }
    Message.model_validate(out)  # the SDK's own model, validated strictly


@pytest.mark.parametrize("finish, vllm_stop, calls, expected", [
    ("stop", None, False, ("end_turn", None)),
    ("stop", 151645, False, ("end_turn", None)),  # a stop token id is not a stop sequence
    ("stop", "END", False, ("stop_sequence", "END")),
    ("length", None, False, ("max_tokens", None)),
    ("tool_calls", None, True, ("tool_use", None)),
    ("stop", None, True, ("tool_use", None)),  # a named tool_choice: vLLM says "stop"
    ("content_filter", None, False, ("refusal", None)),
    ("repetition", None, False, ("end_turn", None)),  # vLLM's repetition detector ended the turn
    ("repetition", None, True, ("end_turn", None)),
])
def test_stop_reasons(finish, vllm_stop, calls, expected):
    message = {"content": "x", **({"tool_calls": [CALL]} if calls else {})}
    out = adialect.from_chat_response(vllm_completion(message, finish, vllm_stop), response_id="m", model="m")
    assert (out["stop_reason"], out["stop_sequence"]) == expected


@pytest.mark.parametrize("finish", ["abort", "error", None])
def test_unknown_finish_reason_raises(finish):
    with pytest.raises(DialectError, match="finish_reason"):
        adialect.from_chat_response(vllm_completion({"content": "x"}, finish), response_id="m", model="m")


@pytest.mark.parametrize("arguments, needle", [('{"command": ', "not valid JSON"), ("[1]", "not an object")])
def test_tool_arguments_that_are_not_an_object_raise(arguments, needle):
    call = {**CALL, "function": {"name": "Bash", "arguments": arguments}}
    with pytest.raises(DialectError, match=needle):
        adialect.from_chat_response(vllm_completion({"tool_calls": [call]}, "tool_calls"), response_id="m", model="m")


def test_empty_text_makes_no_block_and_usage_falls_back_to_ids():
    chat = vllm_completion({"content": ""})
    del chat["usage"]
    out = adialect.from_chat_response(chat, response_id="m", model="m")
    assert out["content"] == [] and out["usage"]["input_tokens"] == 11 and out["usage"]["output_tokens"] == 3


def test_two_choices_raise():
    chat = vllm_completion({"content": "x"})
    chat["choices"].append(chat["choices"][0])
    with pytest.raises(DialectError, match="n=1"):
        adialect.from_chat_response(chat, response_id="m", model="m")


# -- streaming ------------------------------------------------------------------------


def chunk(delta: dict | None = None, finish: str | None = None, **top) -> dict:
    choice = {"index": 0, "delta": delta or {}, "logprobs": {"content": []}, "finish_reason": finish,
              "token_ids": [1]}
    if finish is not None:
        choice["stop_reason"] = top.pop("stop_reason", None)
    return {"id": "c", "object": "chat.completion.chunk", "created": 7, "model": "p", "choices": [choice], **top}


def tool_delta(index: int, **fields) -> dict:
    return {"content": None, "tool_calls": [{"index": index, **fields}]}


def vllm_stream() -> list[dict]:
    return [
        {"id": "c", "object": "chat.completion.chunk", "created": 7, "model": "p", "prompt_token_ids": [1] * 11,
         "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                      "finish_reason": None}]},
        chunk({"reasoning": " hm"}), chunk({"reasoning": "m"}), chunk({}),
        chunk({"content": "Hi"}), chunk({"content": "."}),
        chunk(tool_delta(0, id="call-a", type="function", function={"name": "Bash"})),
        chunk(tool_delta(0, function={"arguments": '{"command": '})),
        chunk(tool_delta(0, function={"arguments": '"ls"}'})),
        chunk(tool_delta(1, id="call-b", type="function", function={"name": "Read", "arguments": "{}"})),
        chunk({}, "tool_calls"),
        {"id": "c", "object": "chat.completion.chunk", "created": 7, "model": "p", "choices": [],
         "usage": {"prompt_tokens": 11, "completion_tokens": 10, "total_tokens": 21}},
    ]


def run(chunks: list[dict]) -> tuple[list, list, tuple]:
    translator = adialect.StreamTranslator("msg_s", "claude-x")
    fed = [event for c in chunks for event in translator.feed(c)]
    rest, terminal = translator.finish()
    return fed, rest, terminal


def test_stream_events_in_anthropic_order():
    fed, rest, terminal = run(vllm_stream())
    names = [name for name, _ in fed + rest + [terminal]]
    assert names == [
        "message_start", "ping",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta",
        "content_block_stop", "message_delta", "message_stop",
    ]
    assert [name for name, _ in rest] == ["content_block_stop", "message_delta"]
    assert terminal == ("message_stop", {"type": "message_stop"})
    assert all(data["type"] == name for name, data in fed + rest + [terminal])
    assert fed[0][1]["message"]["usage"]["input_tokens"] == 11  # from the first chunk's prompt ids
    assert fed[10][1]["content_block"] == {"type": "tool_use", "id": "call-a", "name": "Bash", "input": {}}
    assert fed[11][1]["delta"] == {"type": "input_json_delta", "partial_json": '{"command": '}
    assert rest[1][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert rest[1][1]["usage"]["output_tokens"] == 10  # the trailing usage chunk wins


def test_stream_accumulates_to_the_non_streaming_message():
    fed, rest, terminal = run(vllm_stream())
    snapshot = None
    json_bufs: dict = {}
    for name, data in fed + rest + [terminal]:
        if name == "ping":
            continue
        event = EVENTS.validate_python(data)  # every event validates against the SDK's union
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=json_bufs)
    message = {"content": "Hi.", "reasoning": " hmm", "tool_calls": [
        {"id": "call-a", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "ls"}'}},
        {"id": "call-b", "type": "function", "function": {"name": "Read", "arguments": "{}"}}]}
    plain = adialect.from_chat_response(vllm_completion(message, "tool_calls"), response_id="msg_s", model="claude-x")
    plain["usage"]["output_tokens"] = 10
    assert snapshot.model_dump(exclude_none=True) == Message.model_validate(plain).model_dump(exclude_none=True)


def test_stream_without_usage_counts_ids_and_first_content_opens_nothing():
    chunks = [c for c in vllm_stream() if c["choices"]][:1] + [chunk({"content": "Hey"}), chunk({}, "length")]
    fed, rest, _ = run(chunks)
    assert [name for name, _ in fed] == ["message_start", "ping", "content_block_start", "content_block_delta"]
    assert rest[-1][1]["delta"]["stop_reason"] == "max_tokens" and rest[-1][1]["usage"]["output_tokens"] == 2


def test_stop_sequence_in_stream():
    fed, rest, _ = run([chunk({"content": "a"}), chunk({}, "stop", stop_reason="END")])
    assert rest[-1][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    assert fed[0][1]["message"]["usage"]["input_tokens"] == 0  # unknown at message_start


def test_finish_without_finish_reason_raises():
    translator = adialect.StreamTranslator("m", "m")
    translator.feed(chunk({"content": "a"}))
    with pytest.raises(DialectError, match="interrupted"):
        translator.finish()


def test_interleaved_tool_calls_raise():
    translator = adialect.StreamTranslator("m", "m")
    translator.feed(chunk(tool_delta(0, id="a", function={"name": "A"})))
    translator.feed(chunk(tool_delta(1, id="b", function={"name": "B"})))
    with pytest.raises(DialectError, match="continued"):
        translator.feed(chunk(tool_delta(0, function={"arguments": "{}"})))


def test_first_tool_delta_needs_id_and_name():
    with pytest.raises(DialectError, match="lacks id or function.name"):
        adialect.StreamTranslator("m", "m").feed(chunk(tool_delta(0, function={"arguments": "{}"})))


def test_encode_sse():
    raw = adialect.encode_sse("content_block_delta", {"type": "content_block_delta", "text": "é"})
    assert raw == 'event: content_block_delta\ndata: {"type":"content_block_delta","text":"é"}\n\n'.encode()
    assert json.loads(raw.decode().split("data: ")[1]) == {"type": "content_block_delta", "text": "é"}


def test_no_token_field_is_emitted():
    # the inputs carry prompt_token_ids, token_ids and log-probs; nothing of them comes out
    fed, rest, terminal = run(vllm_stream())
    plain = adialect.from_chat_response(vllm_completion({"content": "x", "tool_calls": [CALL]}, "tool_calls"),
                                        response_id="m", model="m")
    text = json.dumps([fed, rest, terminal, plain])
    for key in ('"prompt_token_ids"', '"token_ids"', '"logprobs"', '"logprob"', '"top_logprobs"'):
        assert key not in text
