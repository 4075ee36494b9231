"""vLLM chat completion / chunks -> Gemini GenerateContentResponse / stream chunks (unit level), and errors."""

from __future__ import annotations

import json

import pytest
from google.genai import types

from producers.dialects import google as g
from producers.dialects.common import DialectError, encode_sse_data
from producers.dialects.google_stream import error_body
from tests.unit.producers.dialects.conftest import assert_clean
from tests.unit.producers.dialects.test_dialect_anthropic_response import chunk, tool_delta, vllm_completion

CALL = {"id": "chatcmpl-tool-9", "type": "function", "function": {"name": "run_shell_command",
                                                                  "arguments": '{"command": "ls"}'}}


def test_full_answer():
    chat = vllm_completion({"content": "Hi.", "reasoning": " hmm", "tool_calls": [CALL]}, "tool_calls")
    out = g.from_chat_response(chat, response_id="gen_x", model="gemini-2.5-pro", thoughts=True)
    assert out == {
        "candidates": [{"content": {"role": "model", "parts": [
            {"text": " hmm", "thought": True}, {"text": "Hi."},
            {"functionCall": {"id": "chatcmpl-tool-9", "name": "run_shell_command", "args": {"command": "ls"}}}]},
            "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": 11, "candidatesTokenCount": 3, "totalTokenCount": 14},
        "modelVersion": "gemini-2.5-pro", "responseId": "gen_x"}
    parsed = types.GenerateContentResponse.model_validate(out)  # the SDK's own model
    assert parsed.function_calls[0].args == {"command": "ls"} and parsed.response_id == "gen_x"
    assert_clean(out)


def test_thoughts_are_shown_only_when_asked_and_counted_when_the_engine_says():
    chat = vllm_completion({"content": "Hi.", "reasoning": "hmm"})
    chat["usage"]["completion_tokens_details"] = {"reasoning_tokens": 2}
    out = g.from_chat_response(chat, response_id="gen_x", model="m")
    assert out["candidates"][0]["content"]["parts"] == [{"text": "Hi."}]
    assert out["usageMetadata"] == {"promptTokenCount": 11, "candidatesTokenCount": 1, "thoughtsTokenCount": 2,
                                    "totalTokenCount": 14}


@pytest.mark.parametrize(("finish", "expected"), [("stop", "STOP"), ("tool_calls", "STOP"), ("length", "MAX_TOKENS"),
                                                  ("content_filter", "SAFETY"), ("repetition", "STOP")])
def test_finish_reasons(finish, expected):
    out = g.from_chat_response(vllm_completion({"content": "x"}, finish), response_id="gen_x", model="m")
    assert out["candidates"][0]["finishReason"] == expected


@pytest.mark.parametrize(("arguments", "needle"), [("[1]", "not an object"), ("{", "not valid JSON")])
def test_arguments_that_are_not_an_object_are_refused(arguments, needle):
    call = {**CALL, "function": {"name": "f", "arguments": arguments}}
    with pytest.raises(DialectError, match=needle):
        g.from_chat_response(vllm_completion({"tool_calls": [call]}, "tool_calls"), response_id="gen_x", model="m")


def test_an_aborted_generation_is_refused():
    with pytest.raises(DialectError, match="abort"):
        g.from_chat_response(vllm_completion({"content": "x"}, "abort"), response_id="gen_x", model="m")


def vllm_stream() -> list[dict]:
    return [
        {"id": "c", "object": "chat.completion.chunk", "created": 7, "model": "p", "prompt_token_ids": [1] * 11,
         "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                      "finish_reason": None}]},
        chunk({"reasoning": " hm"}), chunk({"content": "Hi"}), chunk({"content": "."}),
        chunk(tool_delta(0, id="call-a", type="function", function={"name": "run_shell_command"})),
        chunk(tool_delta(0, function={"arguments": '{"command": '})),
        chunk(tool_delta(0, function={"arguments": '"ls"}'})),
        chunk(tool_delta(1, id="call-b", type="function", function={"name": "read_file", "arguments": ""})),
        chunk({}, "tool_calls"),
        {"id": "c", "object": "chat.completion.chunk", "created": 7, "model": "p", "choices": [],
         "usage": {"prompt_tokens": 11, "completion_tokens": 9, "total_tokens": 20}},
    ]


def test_a_stream_passes_text_through_and_sends_each_function_call_once_complete():
    t = g.StreamTranslator("gen_x", "m", thoughts=True)
    fed = [[data for _, data in t.feed(c)] for c in vllm_stream()]
    parts = [[p for d in f for p in d["candidates"][0]["content"]["parts"]] for f in fed]
    assert parts[:4] == [[], [{"text": " hm", "thought": True}], [{"text": "Hi"}], [{"text": "."}]]
    assert parts[4:7] == [[], [], []]  # the first call's arguments are not complete yet
    assert parts[7] == [{"functionCall": {"id": "call-a", "name": "run_shell_command", "args": {"command": "ls"}}}]
    assert parts[8] == [{"functionCall": {"id": "call-b", "name": "read_file", "args": {}}}]  # the finish completes it
    rest, (_, terminal) = t.finish()
    assert rest == []
    assert terminal == {"candidates": [{"content": {"role": "model", "parts": []}, "finishReason": "STOP", "index": 0}],
                        "modelVersion": "m", "responseId": "gen_x",
                        "usageMetadata": {"promptTokenCount": 11, "candidatesTokenCount": 9, "totalTokenCount": 20}}
    for data in [d for f in fed for d in f] + [terminal]:
        assert data["responseId"] == "gen_x" and data["modelVersion"] == "m"
        types.GenerateContentResponse.model_validate(data)
        assert_clean(data)


def test_the_stream_concatenates_to_the_plain_answer():
    t = g.StreamTranslator("gen_x", "m", thoughts=True)
    events = [e for c in vllm_stream() for e in t.feed(c)]
    rest, terminal = t.finish()
    parts = [p for _, d in [*events, *rest, terminal] for p in d["candidates"][0]["content"]["parts"]]
    plain = g.from_chat_response(vllm_completion({"content": "Hi.", "reasoning": " hm", "tool_calls": [
        {**CALL, "id": "call-a"}, {"id": "call-b", "type": "function", "function": {"name": "read_file",
                                                                                      "arguments": "{}"}}]},
        "tool_calls"), response_id="gen_x", model="m", thoughts=True)
    merged = [parts[0], {"text": parts[1]["text"] + parts[2]["text"]}, *parts[3:]]
    assert merged == plain["candidates"][0]["content"]["parts"]


def test_thoughts_are_not_streamed_unless_asked():
    t = g.StreamTranslator("gen_x", "m")
    assert t.feed(chunk({"reasoning": "secret"})) == []


def test_an_interrupted_stream_is_not_closed_as_complete():
    t = g.StreamTranslator("gen_x", "m")
    t.feed(chunk({"content": "Hi"}))
    with pytest.raises(DialectError, match="without a finish_reason"):
        t.finish()


def test_a_held_call_with_bad_arguments_is_refused_when_completed():
    t = g.StreamTranslator("gen_x", "m")
    t.feed(chunk(tool_delta(0, id="a", type="function", function={"name": "f", "arguments": "[1"})))
    with pytest.raises(DialectError, match="not valid JSON"):
        t.feed(chunk({}, "tool_calls"))


@pytest.mark.parametrize(("status", "code"), [(400, "INVALID_ARGUMENT"), (404, "NOT_FOUND"), (409, "ABORTED"),
                                              (429, "RESOURCE_EXHAUSTED"), (503, "UNAVAILABLE"),
                                              (504, "DEADLINE_EXCEEDED"), (500, "INTERNAL"), (502, "UNAVAILABLE")])
def test_errors_have_googles_shape(status, code):
    assert error_body(status, "why") == {"error": {"code": status, "message": "why", "status": code}}


def test_stream_events_are_data_lines_only():
    encoded = encode_sse_data("message", {"a": "é"})
    assert encoded == 'data: {"a":"é"}\n\n'.encode()
    assert json.loads(encoded.decode()[len("data: "):]) == {"a": "é"}
