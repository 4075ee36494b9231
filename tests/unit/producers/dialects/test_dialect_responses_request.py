"""OpenAI Responses request -> chat completions request, dropped keys and lineage items."""

from __future__ import annotations

import pytest

from producers.capture.events import request_items
from producers.dialects import responses as rdialect
from producers.dialects.common import DialectError
from producers.engine.extract import chat_output_items
from schemas.hashing import assistant_fingerprint, conversation_digest

PARAMS = {"type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}}},
          "required": ["command"]}


def codex_body() -> dict:
    """A request shaped like the Codex CLI's (abridged)."""
    return {
        "model": "gpt-5-codex",
        "instructions": "You are Codex.",
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "sandbox: ro"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<env>x</env>"},
                                                             {"type": "input_text", "text": "list files"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Short."}],
             "content": [{"type": "reasoning_text", "text": " Think"}, {"type": "reasoning_text", "text": "ing."}],
             "encrypted_content": None},
            {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
             "content": [{"type": "output_text", "text": "Listing.", "annotations": []}]},
            {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "shell",
             "arguments": '{"command":["ls"]}'},
            {"type": "function_call", "call_id": "call_2", "name": "shell", "arguments": '{"command": ["pwd"]}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "a\nb"},
            {"type": "function_call_output", "call_id": "call_2", "output": [
                {"type": "input_text", "text": "/w"}, {"type": "input_image", "image_url": "data:x"}]},
            {"role": "user", "content": "thanks"},
        ],
        "tools": [{"type": "function", "name": "shell", "description": "Run", "strict": False, "parameters": PARAMS},
                  {"type": "web_search"}, {"type": "custom", "name": "apply_patch"}],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "abc",
        "max_output_tokens": 1000,
        "text": {"verbosity": "medium"},
    }


def test_codex_request_translates_faithfully():
    chat = rdialect.to_chat_request(codex_body())
    assert chat == {
        "model": "gpt-5-codex",
        "messages": [
            {"role": "system", "content": "You are Codex."},
            {"role": "system", "content": "sandbox: ro"},
            {"role": "user", "content": "<env>x</env>\nlist files"},
            {"role": "assistant", "content": "Listing.", "reasoning": " Thinking.", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "shell", "arguments": '{"command":["ls"]}'}},
                {"id": "call_2", "type": "function",
                 "function": {"name": "shell", "arguments": '{"command": ["pwd"]}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "a\nb"},
            {"role": "tool", "tool_call_id": "call_2", "content": "/w\n[image]"},
            {"role": "user", "content": "thanks"},
        ],
        "max_tokens": 1000,
        "stream": True,
        "stream_options": {"include_usage": True},
        "tools": [{"type": "function", "function": {"name": "shell", "description": "Run", "parameters": PARAMS,
                                                    "strict": False}}],
        "tool_choice": "auto",
        "chat_template_kwargs": {"enable_thinking": True},
    }
    assert rdialect.dropped_keys(codex_body()) == ["parallel_tool_calls", "store", "include", "prompt_cache_key"]


def test_string_input_and_sampling():
    chat = rdialect.to_chat_request({"model": "m", "input": "hi", "temperature": 0.5, "top_p": 0.9})
    assert chat == {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.5, "top_p": 0.9}


def test_assistant_turns_group_as_the_model_produced_them():
    items = [
        {"role": "user", "content": "a"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},  # a call without text
        {"type": "function_call_output", "call_id": "c1", "output": "r"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]},  # summary only: no reasoning
        {"type": "message", "role": "assistant", "content": "one"},
        {"type": "message", "role": "assistant", "content": "two"},  # a second turn
        {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "r1"}]},
        {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "r2"}]},  # r1 alone was a turn
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "three"}]},
    ]
    assert rdialect.to_chat_request({"input": items})["messages"] == [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "r"},
        {"role": "assistant", "content": "one"},
        {"role": "assistant", "content": "two"},
        {"role": "assistant", "content": None, "reasoning": "r1"},
        {"role": "assistant", "content": "three", "reasoning": "r2"},
    ]


def test_images_in_user_content():
    content = [{"type": "input_text", "text": "see"}, {"type": "input_image", "image_url": "https://x/i.png",
                                                       "detail": "high"}]
    chat = rdialect.to_chat_request({"input": [{"type": "message", "role": "user", "content": content}]})
    assert chat["messages"] == [{"role": "user", "content": [
        {"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": "https://x/i.png",
                                                                             "detail": "high"}}]}]


@pytest.mark.parametrize("choice, expected", [
    ("auto", "auto"), ("none", "none"), ("required", "required"),
    ({"type": "function", "name": "f"}, {"type": "function", "function": {"name": "f"}}),
])
def test_tool_choice(choice, expected):
    body = {"input": "x", "tools": [{"type": "function", "name": "f", "parameters": {}}], "tool_choice": choice}
    assert rdialect.to_chat_request(body)["tool_choice"] == expected


@pytest.mark.parametrize("reasoning, expected", [
    ({"effort": "high"}, True), ({"effort": "minimal"}, True), ({"effort": "none"}, False),
    ({"effort": None}, False), ({"summary": "auto"}, None), (None, None)])
def test_reasoning_effort(reasoning, expected):
    chat = rdialect.to_chat_request({"input": "x", "reasoning": reasoning})
    assert chat.get("chat_template_kwargs", {}).get("enable_thinking") == expected


@pytest.mark.parametrize("fmt, expected", [
    ({"type": "text"}, None),
    ({"type": "json_object"}, {"type": "json_object"}),
    ({"type": "json_schema", "name": "out", "schema": {"type": "object"}, "strict": True},
     {"type": "json_schema", "json_schema": {"name": "out", "schema": {"type": "object"}, "strict": True}}),
])
def test_text_format(fmt, expected):
    chat = rdialect.to_chat_request({"input": "x", "text": {"format": fmt}})
    assert chat.get("response_format") == expected


@pytest.mark.parametrize("extra, needle", [
    ({"previous_response_id": "resp_1"}, "store=false"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"background": True}, "background"),
    ({"prompt": {"id": "p"}}, "prompt"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "'item_reference'"),
    ({"input": [{"type": "local_shell_call", "id": "x"}]}, "'local_shell_call'"),
    ({"input": [{"role": "critic", "content": "x"}]}, "'critic'"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "'input_file'"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "call_id"),
    ({"input": 5}, "'input'"),
    ({"tool_choice": {"type": "web_search"}, "tools": [{"type": "function", "name": "f"}]}, "tool_choice"),
    ({"text": {"format": {"type": "grammar"}}}, "'grammar'"),
])
def test_untranslatable_requests_raise(extra, needle):
    with pytest.raises(DialectError) as info:
        rdialect.to_chat_request({"input": "x", **extra})
    assert needle in str(info.value)


def test_hash_items():
    body = codex_body()
    items, instructions, tools = rdialect.hash_items(body)
    assert items == body["input"] and items is not body["input"]
    assert instructions == "You are Codex." and tools == body["tools"]
    assert rdialect.hash_items({"input": "hi"})[0] == [{"type": "message", "role": "user", "content": "hi"}]


def test_responses_echo_fingerprints_like_the_captured_chat_output():
    message = {"role": "assistant", "content": None, "reasoning": " r",
               "tool_calls": [{"id": "call-1", "type": "function",
                               "function": {"name": "shell", "arguments": '{"command": ["ls"]}'}}]}
    request = {"instructions": "I", "input": "go"}
    answer = rdialect.from_chat_response({"choices": [{"message": message, "finish_reason": "tool_calls"}]},
                                         response_id="resp_1", model="m", request=request)
    second = {"instructions": "I", "input": [{"type": "message", "role": "user", "content": "go"}, *answer["output"],
                                             {"type": "function_call_output", "call_id": "call-1", "output": "ok"}]}

    def items(body):
        found, instructions, tools = rdialect.hash_items(body)
        return request_items(found, instructions=instructions, tools=tools)

    output, _ = chat_output_items(message)
    assert assistant_fingerprint(items(second)) == assistant_fingerprint(items(request) + output) != ""
    assert conversation_digest(items(second)[:2]) == conversation_digest(items(request))
