"""Anthropic Messages request -> chat completions request, dropped keys and lineage items."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from producers.capture.events import request_items
from producers.dialects import anthropic as adialect
from producers.dialects.common import DialectError
from producers.engine.extract import chat_output_items
from schemas.hashing import assistant_fingerprint, conversation_digest

REPO = Path(__file__).resolve().parents[4]
EPHEMERAL = {"type": "ephemeral"}
SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}


def claude_code_body() -> dict:
    """A request shaped like the Claude Code CLI's (abridged)."""
    return {
        "model": "claude-sonnet-4-5",
        "max_tokens": 32000,
        "temperature": 1,
        "stream": True,
        "metadata": {"user_id": "user_abc_session_1"},
        "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": EPHEMERAL},
                   {"type": "text", "text": "Be careful.", "cache_control": EPHEMERAL}],
        "thinking": {"type": "enabled", "budget_tokens": 31999},
        "context_management": {"edits": []},
        "tools": [
            {"name": "Bash", "description": "Run a command", "input_schema": SCHEMA, "cache_control": EPHEMERAL},
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
        ],
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "<system-reminder>ctx</system-reminder>"},
                {"type": "text", "text": "List files", "cache_control": EPHEMERAL}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": " I should list.", "signature": "sig=="},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "Listing."},
                {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls ü", "n": [1, 2]}},
                {"type": "tool_use", "id": "toolu_2", "name": "Bash", "input": {}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt\nb.txt"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True, "content": [
                    {"type": "text", "text": "Error: denied"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]},
                {"type": "text", "text": "continue", "cache_control": EPHEMERAL}]},
            {"role": "system", "content": "Plan mode is off."},
        ],
    }


def test_claude_code_request_translates_faithfully():
    chat = adialect.to_chat_request(claude_code_body())
    assert chat == {
        "model": "claude-sonnet-4-5",
        "messages": [
            {"role": "system", "content": "You are Claude Code.\nBe careful."},
            {"role": "user", "content": "<system-reminder>ctx</system-reminder>\nList files"},
            {"role": "assistant", "content": "Listing.", "reasoning": " I should list.", "tool_calls": [
                {"id": "toolu_1", "type": "function",
                 "function": {"name": "Bash", "arguments": '{"command": "ls ü", "n": [1, 2]}'}},
                {"id": "toolu_2", "type": "function", "function": {"name": "Bash", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "a.txt\nb.txt"},
            {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: denied\n[image]"},
            {"role": "user", "content": "continue"},
            {"role": "system", "content": "Plan mode is off."},
        ],
        "max_tokens": 32000,
        "temperature": 1,
        "stream": True,
        "stream_options": {"include_usage": True},
        "tools": [{"type": "function", "function": {"name": "Bash", "description": "Run a command",
                                                    "parameters": SCHEMA}}],
        "chat_template_kwargs": {"enable_thinking": True},
    }
    assert "cache_control" not in json.dumps(chat)
    assert adialect.dropped_keys(claude_code_body()) == ["metadata", "context_management"]


def test_tool_arguments_use_default_json_separators_and_keep_unicode():
    body = {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": {"b": "é", "a": {"x": 1.5, "y": None}}}]}]}
    arguments = adialect.to_chat_request(body)["messages"][1]["tool_calls"][0]["function"]["arguments"]
    assert arguments == '{"b": "é", "a": {"x": 1.5, "y": null}}'  # insertion order, ", " and ": "


def test_sampling_and_stop_sequences():
    chat = adialect.to_chat_request({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 5,
                                     "top_p": 0.9, "top_k": 40, "stop_sequences": ["END", "STOP"],
                                     "temperature": None})
    assert chat == {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 5, "top_p": 0.9,
                    "top_k": 40, "stop": ["END", "STOP"]}


@pytest.mark.parametrize("choice, expected", [
    ({"type": "auto"}, "auto"),
    ({"type": "any"}, "required"),
    ({"type": "none"}, "none"),
    ({"type": "tool", "name": "Bash"}, {"type": "function", "function": {"name": "Bash"}}),
])
def test_tool_choice(choice, expected):
    body = {"messages": [], "tools": [{"name": "Bash", "input_schema": SCHEMA}], "tool_choice": choice}
    assert adialect.to_chat_request(body)["tool_choice"] == expected


def test_disable_parallel_tool_use_is_reported_as_dropped():
    body = {"messages": [], "tools": [{"name": "Bash", "input_schema": SCHEMA}],
            "tool_choice": {"type": "auto", "disable_parallel_tool_use": True}, "betas": ["x"]}
    assert adialect.dropped_keys(body) == ["betas", "tool_choice.disable_parallel_tool_use"]


def test_only_server_tools_means_no_tools_and_no_tool_choice():
    body = {"messages": [], "tools": [{"type": "web_search_20250305", "name": "web_search"}],
            "tool_choice": {"type": "any"}}
    chat = adialect.to_chat_request(body)
    assert "tools" not in chat and "tool_choice" not in chat


@pytest.mark.parametrize("thinking, expected", [
    ({"type": "enabled", "budget_tokens": 10}, True), ({"type": "disabled"}, False), ({"type": "adaptive"}, True)])
def test_thinking(thinking, expected):
    chat = adialect.to_chat_request({"messages": [], "thinking": thinking})
    assert chat["chat_template_kwargs"] == {"enable_thinking": expected}
    assert "chat_template_kwargs" not in adialect.to_chat_request({"messages": []})


def test_images_become_image_url_parts():
    content = [{"type": "text", "text": "look"},
               {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "Zm9v"}},
               {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]
    chat = adialect.to_chat_request({"messages": [{"role": "user", "content": content}]})
    assert chat["messages"] == [{"role": "user", "content": [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,Zm9v"}},
        {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}]


def test_prefill_continues_the_last_assistant_message():
    chat = adialect.to_chat_request({"messages": [{"role": "user", "content": "x"},
                                                  {"role": "assistant", "content": "The answer is"}]})
    assert chat["messages"][-1] == {"role": "assistant", "content": "The answer is"}
    assert chat["continue_final_message"] is True and chat["add_generation_prompt"] is False


def test_assistant_with_only_tool_use_has_null_content():
    message = {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {"a": 1}}]}
    chat = adialect.to_chat_request({"messages": [{"role": "user", "content": "x"}, message,
                                                  {"role": "user", "content": [
                                                      {"type": "tool_result", "tool_use_id": "t"}]}]})
    assert chat["messages"][1]["content"] is None
    assert chat["messages"][2] == {"role": "tool", "tool_call_id": "t", "content": ""}


@pytest.mark.parametrize("messages, needle", [
    ([{"role": "user", "content": [{"type": "document", "source": {}}]}], "'document'"),
    ([{"role": "assistant", "content": [{"type": "server_tool_use", "id": "s"}]}], "'server_tool_use'"),
    ([{"role": "user", "content": [{"type": "text", "text": "a"},
                                   {"type": "tool_result", "tool_use_id": "t"}]}], "must come first"),
    ([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                    "content": [{"type": "search_result"}]}]}], "'search_result'"),
    ([{"role": "tool", "content": "x"}], "unknown role 'tool'"),
    ([{"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}]}], "'file'"),
    ([{"role": "user", "content": 3}], "content must be"),
])
def test_untranslatable_content_raises_a_clear_error(messages, needle):
    with pytest.raises(DialectError, match=None) as info:
        adialect.to_chat_request({"messages": messages})
    assert needle in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("body, needle", [
    ({}, "'messages'"),
    ({"messages": [], "tool_choice": {"type": "weird"}, "tools": [{"name": "a", "input_schema": {}}]}, "tool_choice"),
    ({"messages": [], "thinking": {"type": "sometimes"}}, "thinking"),
    ({"messages": [], "tools": [{"name": "a"}]}, "input_schema"),
    ({"messages": [], "system": [{"type": "image"}]}, "system block"),
])
def test_bad_request_fields_raise(body, needle):
    with pytest.raises(DialectError) as info:
        adialect.to_chat_request(body)
    assert needle in str(info.value)


def test_hash_items_strip_cache_control_and_thinking():
    body = claude_code_body()
    items, instructions, tools = adialect.hash_items(body)
    assert "cache_control" not in json.dumps(items) + json.dumps(tools)
    assert instructions == "You are Claude Code.\nBe careful."
    assert [b["type"] for b in items[1]["content"]] == ["text", "tool_use", "tool_use"]
    assert tools[1] == body["tools"][1]  # server tools stay part of the harness's tool set
    assert body["messages"][0]["content"][1]["cache_control"] == EPHEMERAL  # the body is not mutated
    # moving the cache breakpoint (as Claude Code does every turn) changes nothing
    moved = claude_code_body()
    del moved["messages"][0]["content"][1]["cache_control"]
    moved["messages"][2]["content"][0]["cache_control"] = EPHEMERAL
    moved["messages"][2]["content"][1]["content"][0]["cache_control"] = EPHEMERAL
    assert adialect.hash_items(moved) == (items, instructions, tools)


def test_anthropic_echo_fingerprints_like_the_captured_chat_output():
    # the chat message vLLM returned, and the Anthropic blocks the harness echoes for it
    message = {"role": "assistant", "content": "Listing.", "reasoning": " think",
               "tool_calls": [{"id": "chatcmpl-tool-1", "type": "function",
                               "function": {"name": "Bash", "arguments": '{"command": "ls"}'}}]}
    first = {"system": "S", "messages": [{"role": "user", "content": "go"}]}
    echo = adialect.from_chat_response(
        {"choices": [{"message": message, "finish_reason": "tool_calls"}]}, response_id="msg_1", model="m")
    second = {"system": "S", "messages": first["messages"] + [
        {"role": "assistant", "content": echo["content"]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "chatcmpl-tool-1", "content": "ok"}]}]}

    def items(body):
        found, instructions, tools = adialect.hash_items(body)
        return request_items(found, instructions=instructions, tools=tools)

    output, _ = chat_output_items(message)
    assert assistant_fingerprint(items(second)) == assistant_fingerprint(items(first) + output) != ""
    assert conversation_digest(items(second)[:2]) == conversation_digest(items(first))
    # keeping the thinking block would break the link: reasoning is never hashed
    kept = [dict(m) for m in second["messages"]]
    assert assistant_fingerprint(kept) != assistant_fingerprint(items(second))


def test_dialect_modules_import_no_framework():
    code = ("import json, sys, producers.dialects\n"
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'httpx', 'httpx2', 'starlette', 'pydantic', 'anthropic', 'openai', 'orjson', 'numpy'})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
