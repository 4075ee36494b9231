"""vLLM chat completion / chunks -> OpenAI Responses object / SSE events (unit level)."""

from __future__ import annotations

import json

import pytest
from openai import omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from producers.dialects import responses as rdialect
from producers.dialects.common import DialectError

EVENTS = TypeAdapter(ResponseStreamEvent)
REQUEST = {"model": "m", "instructions": "Be brief.", "input": "hi", "temperature": 0.2, "max_output_tokens": 50,
           "tools": [{"type": "function", "name": "Bash", "parameters": {"type": "object"}, "strict": False}],
           "tool_choice": "auto", "parallel_tool_calls": False, "store": False, "metadata": {"k": "v"}}
CALL = {"id": "call-9", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "ls"}'}}


def vllm_completion(message: dict, finish_reason: str = "stop") -> dict:
    full = {"role": "assistant", "content": None, "reasoning": None, "refusal": None, **message}
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 7, "model": "policy",
            "choices": [{"index": 0, "message": full, "finish_reason": finish_reason, "stop_reason": None,
                         "logprobs": {"content": [{"token": "a", "logprob": -0.5}]}, "token_ids": [5, 6, 7]}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14},
            "prompt_token_ids": list(range(11))}


def test_full_response():
    chat = vllm_completion({"content": "Hi.", "reasoning": " hmm", "tool_calls": [CALL]}, "tool_calls")
    out = rdialect.from_chat_response(chat, response_id="resp_x", model="gpt-x", request=REQUEST)
    assert out["output"] == [
        {"type": "reasoning", "id": "rs_resp_x_0", "summary": [],
         "content": [{"type": "reasoning_text", "text": " hmm"}]},
        {"type": "message", "id": "msg_resp_x_1", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "Hi.", "annotations": []}]},
        {"type": "function_call", "id": "fc_resp_x_2", "call_id": "call-9", "name": "Bash",
         "arguments": '{"command": "ls"}', "status": "completed"},
    ]
    assert out["usage"] == {"input_tokens": 11, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                            "output_tokens": 3, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 14}
    assert (out["id"], out["object"], out["created_at"], out["status"], out["model"]) == (
        "resp_x", "response", 7, "completed", "gpt-x")
    assert out["incomplete_details"] is None and out["store"] is False
    assert (out["instructions"], out["temperature"], out["top_p"], out["max_output_tokens"]) == ("Be brief.", 0.2,
                                                                                                 1.0, 50)
    assert (out["tools"], out["tool_choice"], out["parallel_tool_calls"], out["metadata"]) == (
        REQUEST["tools"], "auto", False, {"k": "v"})
    response = Response.model_validate(out)  # the SDK's own model, validated strictly
    assert response.output_text == "Hi."


@pytest.mark.parametrize("finish, status, reason", [
    ("stop", "completed", None), ("tool_calls", "completed", None), ("repetition", "completed", None),
    ("length", "incomplete", "max_output_tokens"), ("content_filter", "incomplete", "content_filter")])
def test_status(finish, status, reason):
    out = rdialect.from_chat_response(vllm_completion({"content": "x"}, finish), response_id="r", model="m",
                                      request={})
    assert out["status"] == status
    assert out["incomplete_details"] == (None if reason is None else {"reason": reason})
    assert out["output"][-1]["status"] == ("completed" if reason is None else "incomplete")
    Response.model_validate(out)


def test_unknown_finish_reason_raises():
    with pytest.raises(DialectError, match="finish_reason"):
        rdialect.from_chat_response(vllm_completion({"content": "x"}, "abort"), response_id="r", model="m", request={})


def test_defaults_for_a_minimal_request():
    out = rdialect.from_chat_response(vllm_completion({"content": ""}), response_id="r", model="m", request={})
    assert out["output"] == [] and out["tools"] == [] and out["tool_choice"] == "auto"
    assert out["parallel_tool_calls"] is True and out["text"] == {"format": {"type": "text"}}
    Response.model_validate(out)


# -- streaming ------------------------------------------------------------------------


def chunk(delta: dict | None = None, finish: str | None = None, **top) -> dict:
    choice = {"index": 0, "delta": delta or {}, "logprobs": {"content": []}, "finish_reason": finish,
              "token_ids": [1]}
    if finish is not None:
        choice["stop_reason"] = None
    return {"id": "c", "object": "chat.completion.chunk", "created": 7, "model": "p", "choices": [choice], **top}


def tool_delta(index: int, **fields) -> dict:
    return {"content": None, "tool_calls": [{"index": index, **fields}]}


def vllm_stream(finish: str = "tool_calls") -> list[dict]:
    return [
        {"id": "c", "object": "chat.completion.chunk", "created": 7, "model": "p", "prompt_token_ids": [1] * 11,
         "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                      "finish_reason": None}]},
        chunk({"reasoning": " hm"}), chunk({"reasoning": "m"}),
        chunk({"content": "Hi"}), chunk({"content": "."}),
        chunk(tool_delta(0, id="call-9", type="function", function={"name": "Bash"})),
        chunk(tool_delta(0, function={"arguments": '{"command": '})),
        chunk(tool_delta(0, function={"arguments": '"ls"}'})),
        chunk({}, finish),
        {"id": "c", "object": "chat.completion.chunk", "created": 7, "model": "p", "choices": [],
         "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}},
    ]


def run(chunks: list[dict], request: dict = REQUEST) -> tuple[list, list, tuple]:
    translator = rdialect.StreamTranslator("resp_x", "gpt-x", request)
    fed = [event for c in chunks for event in translator.feed(c)]
    rest, terminal = translator.finish()
    return fed, rest, terminal


def test_stream_events_in_openai_order():
    fed, rest, terminal = run(vllm_stream())
    names = [name for name, _ in fed + rest + [terminal]]
    assert names == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        "response.reasoning_text.delta", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed",
    ]
    events = fed + rest + [terminal]
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert all(data["type"] == name for name, data in events)
    assert [name for name, _ in rest] == ["response.function_call_arguments.done", "response.output_item.done"]


def test_stream_matches_the_non_streaming_response_and_the_sdk_accepts_it():
    fed, rest, (name, data) = run(vllm_stream())
    state = ResponseStreamState(input_tools=REQUEST["tools"], text_format=omit)
    for _, event in fed + rest + [(name, data)]:
        state.handle_event(EVENTS.validate_python(event))  # validated, then accumulated by the SDK
    plain = rdialect.from_chat_response(
        vllm_completion({"content": "Hi.", "reasoning": " hmm", "tool_calls": [CALL]}, "tool_calls"),
        response_id="resp_x", model="gpt-x", request=REQUEST)
    assert data["response"] == plain
    assert state._completed_response.output_text == "Hi."


def test_incomplete_stream_ends_with_response_incomplete():
    chunks = [chunk({"content": "Hi"}), chunk({}, "length")]
    fed, rest, (name, data) = run(chunks, request={})
    assert name == "response.incomplete" and data["response"]["status"] == "incomplete"
    assert data["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert rest[-1][1]["item"]["status"] == "incomplete"
    plain = rdialect.from_chat_response(vllm_completion({"content": "Hi"}, "length"), response_id="resp_x",
                                        model="gpt-x", request={})
    assert data["response"]["output"] == plain["output"]
    assert data["response"]["usage"]["output_tokens"] == 2  # no usage chunk: counted ids


def test_created_event_carries_an_in_progress_snapshot():
    fed, _, _ = run(vllm_stream())
    created = fed[0][1]["response"]
    assert created["status"] == "in_progress" and created["output"] == [] and created["usage"] is None
    Response.model_validate(created)


def test_finish_without_finish_reason_raises():
    translator = rdialect.StreamTranslator("r", "m", {})
    translator.feed(chunk({"content": "a"}))
    with pytest.raises(DialectError, match="interrupted"):
        translator.finish()


def test_second_choice_raises():
    bad = chunk({"content": "a"})
    bad["choices"][0]["index"] = 1
    with pytest.raises(DialectError, match="n=1"):
        rdialect.StreamTranslator("r", "m", {}).feed(bad)


def test_no_token_field_is_emitted():
    # the inputs carry prompt_token_ids, token_ids and log-probs; nothing of them comes out
    fed, rest, terminal = run(vllm_stream())
    plain = rdialect.from_chat_response(vllm_completion({"content": "x", "tool_calls": [CALL]}, "tool_calls"),
                                        response_id="r", model="m", request=REQUEST)
    text = json.dumps([fed, rest, terminal, plain])
    for key in ('"prompt_token_ids"', '"token_ids"', '"logprob"', '"top_logprobs"'):
        assert key not in text
    # the SDK requires `logprobs` on text events; it is always the empty list
    assert all(data["logprobs"] == [] for _, data in fed + rest if "logprobs" in data)
