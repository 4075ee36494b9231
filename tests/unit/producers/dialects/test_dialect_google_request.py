"""The Gemini request translator (producers.dialects.google): contents, tools, settings, ids, lineage, refusals."""

from __future__ import annotations

import json

import pytest

from producers.capture.events import request_items
from producers.dialects import google as g
from producers.dialects.common import DialectError
from producers.engine.extract import chat_output_items
from schemas.hashing import assistant_fingerprint, conversation_digest

SHELL = {"name": "run_shell_command", "description": "Runs a shell command",
         "parametersJsonSchema": {"type": "object", "properties": {"command": {"type": "string"}},
                                  "required": ["command"]}}
# What the Gemini CLI 0.61.0 sent on its third turn (recorded; the 30 KB system prompt and the session context cut).
CLI_TURN_3 = {
    "contents": [
        {"parts": [{"text": "<session_context>\nThis is the Gemini CLI.\n</session_context>"}, {"text": "list the dir"}],
         "role": "user"},
        {"parts": [{"text": "Let me check."},
                   {"functionCall": {"id": "call_srv_1", "args": {"command": "echo tokentrail"},
                                     "name": "run_shell_command"}, "thoughtSignature": "c2lnMg=="}], "role": "model"},
        {"parts": [{"functionResponse": {"name": "run_shell_command", "response": {
            "output": "<untrusted_context>\nOutput: tokentrail\nProcess Group PGID: 25278\n</untrusted_context>"},
            "id": "call_srv_1"}}], "role": "user"},
        {"parts": [{"functionCall": {"id": "get_weather_1796604361910_0", "args": {"city": "Paris"},
                                     "name": "get_weather"}, "thoughtSignature": "skip_thought_signature_validator"}],
         "role": "model"},
        {"parts": [{"functionResponse": {"name": "get_weather", "response": {"error": "Tool \"get_weather\" not found."},
                                         "id": "get_weather_1796604361910_0"}}], "role": "user"},
    ],
    "systemInstruction": {"role": "user", "parts": [{"text": "You are Gemini CLI. You are in **YOLO** mode."}]},
    "tools": [{"functionDeclarations": [SHELL]}],
    "generationConfig": {"temperature": 1, "topP": 0.95, "topK": 64, "thinkingConfig": {"includeThoughts": True}},
}


def test_the_gemini_clis_request_translates_whole():
    chat = g.to_chat_request(CLI_TURN_3, model="gemini-2.5-pro", stream=True)
    assert chat["model"] == "gemini-2.5-pro" and chat["stream"] is True
    assert chat["stream_options"] == {"include_usage": True}
    assert (chat["temperature"], chat["top_p"], chat["top_k"]) == (1, 0.95, 64)
    assert "chat_template_kwargs" not in chat  # includeThoughts alone leaves the engine's default
    assert chat["tools"] == [{"type": "function", "function": {
        "name": "run_shell_command", "description": "Runs a shell command",
        "parameters": SHELL["parametersJsonSchema"]}}]
    system, user, model1, tool1, model2, tool2 = chat["messages"]
    assert system == {"role": "system", "content": "You are Gemini CLI. You are in **YOLO** mode."}
    assert user == {"role": "user", "content": "<session_context>\nThis is the Gemini CLI.\n</session_context>\n"
                                               "list the dir"}
    assert model1 == {"role": "assistant", "content": "Let me check.", "tool_calls": [
        {"id": "call_srv_1", "type": "function",
         "function": {"name": "run_shell_command", "arguments": '{"command": "echo tokentrail"}'}}]}
    assert tool1 == {"role": "tool", "tool_call_id": "call_srv_1", "content": json.dumps(
        CLI_TURN_3["contents"][2]["parts"][0]["functionResponse"]["response"], ensure_ascii=False)}
    assert model2["content"] is None and model2["tool_calls"][0]["id"] == "get_weather_1796604361910_0"
    assert tool2["tool_call_id"] == "get_weather_1796604361910_0"
    assert g.dropped_keys(CLI_TURN_3) == []
    assert "thoughtSignature" not in json.dumps(chat) and "c2lnMg" not in json.dumps(chat)


def test_thoughts_become_reasoning_and_text_parts_concatenate():
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}, {"role": "model", "parts": [
        {"text": "I should ", "thought": True}, {"text": "greet.", "thought": True, "thoughtSignature": "x"},
        {"text": "Hel"}, {"text": "lo"}]}, {"parts": [{"text": "again"}]}]}
    user, model, again = g.to_chat_request(body)["messages"]
    assert model == {"role": "assistant", "content": "Hello", "reasoning": "I should greet."}
    assert again == {"role": "user", "content": "again"}  # no role: a user turn, as the API allows
    assert user["content"] == "hi"


def test_snake_case_field_names_are_read_like_camel_case():
    """google-genai 3.x sends proto field names (parameters_json_schema, include_thoughts): the API accepts both."""
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}],
            "system_instruction": {"parts": [{"text": "sys"}]},
            "tools": [{"function_declarations": [{"name": "f", "parameters_json_schema": {"type": "object"}}]}],
            "generation_config": {"max_output_tokens": 9, "thinking_config": {"thinking_budget": 0}},
            "tool_config": {"function_calling_config": {"mode": "ANY", "allowed_function_names": ["f"]}}}
    chat = g.to_chat_request(body)
    assert chat["messages"][0] == {"role": "system", "content": "sys"} and chat["max_tokens"] == 9
    assert chat["tools"][0]["function"]["parameters"] == {"type": "object"}
    assert chat["chat_template_kwargs"] == {"enable_thinking": False}
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    with pytest.raises(DialectError, match="spells one field twice"):
        g.to_chat_request({**body, "generationConfig": {}})


def test_a_gemini_schema_becomes_json_schema():
    schema = {"type": "OBJECT", "properties": {"path": {"type": "STRING", "nullable": True, "description": "p"},
                                               "n": {"type": "ARRAY", "items": {"type": "INTEGER"}},
                                               "any": {"anyOf": [{"type": "NUMBER"}, {"type": "BOOLEAN"}]}},
              "required": ["path"]}
    body = {"contents": [{"parts": [{"text": "x"}]}], "tools": [{"functionDeclarations": [
        {"name": "read", "parameters": schema}]}, {"googleSearch": {}}]}
    (tool,) = g.to_chat_request(body)["tools"]  # the hosted googleSearch tool is not offered
    assert tool["function"]["parameters"] == {
        "type": "object", "required": ["path"],
        "properties": {"path": {"type": ["string", "null"], "description": "p"},
                       "n": {"type": "array", "items": {"type": "integer"}},
                       "any": {"anyOf": [{"type": "number"}, {"type": "boolean"}]}}}


@pytest.mark.parametrize(("config", "expected"), [
    ({"mode": "AUTO"}, "auto"), ({"mode": "NONE"}, "none"), ({"mode": "ANY"}, "required"),
    ({"mode": "ANY", "allowedFunctionNames": ["run_shell_command"]},
     {"type": "function", "function": {"name": "run_shell_command"}}),
])
def test_function_calling_config(config, expected):
    body = {**CLI_TURN_3, "toolConfig": {"functionCallingConfig": config}}
    assert g.to_chat_request(body)["tool_choice"] == expected


def test_generation_config_maps_to_chat_sampling():
    config = {"temperature": 0, "topP": 1, "topK": 64.0, "maxOutputTokens": 100, "stopSequences": ["END"], "seed": 7,
              "presencePenalty": 0.5, "frequencyPenalty": 0.25, "candidateCount": 1, "responseModalities": ["TEXT"],
              "responseMimeType": "application/json",
              "responseJsonSchema": {"type": "object", "properties": {"next_speaker": {"type": "string"}}}}
    chat = g.to_chat_request({"contents": [{"parts": [{"text": "x"}]}], "generationConfig": config})
    assert {k: chat[k] for k in ("temperature", "top_p", "top_k", "max_tokens", "stop", "seed", "presence_penalty",
                                 "frequency_penalty")} == {
        "temperature": 0, "top_p": 1, "top_k": 64, "max_tokens": 100, "stop": ["END"], "seed": 7,
        "presence_penalty": 0.5, "frequency_penalty": 0.25}
    assert isinstance(chat["top_k"], int)
    assert chat["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "response", "schema": config["responseJsonSchema"]}}
    json_only = {"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"responseMimeType": "application/json"}}
    assert g.to_chat_request(json_only)["response_format"] == {"type": "json_object"}


def test_missing_ids_are_derived_deterministically_and_pair_by_name():
    body = {"contents": [
        {"role": "user", "parts": [{"text": "go"}]},
        {"role": "model", "parts": [{"functionCall": {"name": "a", "args": {}}}, {"functionCall": {"name": "b"}},
                                    {"functionCall": {"name": "a", "args": {"x": 1}}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "a", "response": {"r": 1}}},
                                   {"functionResponse": {"name": "a", "response": {"r": 2}}},
                                   {"functionResponse": {"name": "b", "response": {}}}, {"text": "more"}]}]}
    _, model, t1, t2, t3, more = g.to_chat_request(body)["messages"]
    assert [c["id"] for c in model["tool_calls"]] == ["call_1_0", "call_1_1", "call_1_2"]
    assert model["tool_calls"][1]["function"]["arguments"] == "{}"
    assert [(t["tool_call_id"], t["content"]) for t in (t1, t2, t3)] == [
        ("call_1_0", '{"r": 1}'), ("call_1_2", '{"r": 2}'), ("call_1_1", "{}")]
    assert more == {"role": "user", "content": "more"}
    assert g.to_chat_request(body) == g.to_chat_request(body)


def test_a_trailing_model_turn_is_continued():
    chat = g.to_chat_request({"contents": [{"parts": [{"text": "x"}]}, {"role": "model", "parts": [{"text": "Su"}]}]})
    assert chat["continue_final_message"] is True and chat["add_generation_prompt"] is False


def test_lineage_links_across_the_gemini_echo():
    """A request's model turns hash like the captured answer of the call before it (tool call ids included)."""
    before = {"contents": CLI_TURN_3["contents"][:1], "systemInstruction": CLI_TURN_3["systemInstruction"],
              "tools": CLI_TURN_3["tools"]}
    answer = {"role": "assistant", "content": "Let me check.", "reasoning": "I should look first.",
              "tool_calls": [{"id": "call_srv_1", "type": "function", "function": {
                  "name": "run_shell_command", "arguments": '{"command": "echo tokentrail"}'}}]}
    after = {**before, "contents": CLI_TURN_3["contents"][:3]}
    items_before, items_after = (_items(b) for b in (before, after))
    output, _ = chat_output_items(answer)
    assert assistant_fingerprint(items_after) == assistant_fingerprint(items_before + output)
    assert conversation_digest(items_after[: len(items_before)]) == conversation_digest(items_before)


def _items(body: dict) -> list[dict]:
    """What the interceptor hashes: the envelope pseudo-turn + the items."""
    items, instructions, tools = g.hash_items(body)
    return request_items(items, instructions=instructions, tools=tools)


@pytest.mark.parametrize(("body", "needle"), [
    ({"contents": []}, "'contents' must be a non-empty list"),
    ({"contents": [{"role": "system", "parts": [{"text": "x"}]}]}, "'contents[0].role' must be user or model"),
    ({"contents": [{"role": "user", "parts": []}]}, "'contents[0].parts' must be a non-empty list"),
    ({"contents": [{"parts": [{"text": "x", "inlineData": {}}]}]}, "exactly one of"),
    ({"contents": [{"parts": [{"fileData": {"fileUri": "gs://x"}}]}]}, "fileData part"),
    ({"contents": [{"parts": [{"text": "x", "thought": True}]}]}, "thought part, which only a model content"),
    ({"contents": [{"parts": [{"inlineData": {"mimeType": "audio/wav", "data": "AA=="}}]}]}, "must be an image"),
    ({"contents": [{"parts": [{"text": "x"}, {"functionResponse": {"name": "f", "id": "1"}}]}]},
     "functionResponse parts must come first"),
    ({"contents": [{"parts": [{"functionResponse": {"name": "f"}}]}]}, "has no id and answers no unanswered call"),
    ({"contents": [{"parts": [{"functionResponse": {"name": "f", "id": "1", "willContinue": True}}]}]},
     "functionResponse.willContinue"),
    ({"contents": [{"role": "model", "parts": [{"functionCall": {"name": "f", "args": [1]}}]}]},
     "'contents[0].parts[0].functionCall.args' must be an object"),
    ({"cachedContent": "cachedContents/x", "contents": [{"parts": [{"text": "x"}]}]}, "'cachedContent' is not"),
    ({"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"candidateCount": 2}},
     "'generationConfig.candidateCount' must be 1, got number 2"),
    ({"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"responseLogprobs": True}},
     "'generationConfig.responseLogprobs' cannot be served"),
    ({"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"responseModalities": ["IMAGE"]}},
     "answers text only"),
    ({"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"topK": 1.5}}, "whole number"),
    ({"contents": [{"parts": [{"text": "x"}]}], "tools": [{"functionDeclarations": [
        {"name": "f", "parameters": {"type": "STRING"}}]}]},
     "'tools[0].functionDeclarations[0].parameters.type' must be object"),
    ({"contents": [{"parts": [{"text": "x"}]}], "tools": [{"functionDeclarations": [
        {"name": "f", "parametersJsonSchema": "{}"}]}]},
     "'tools[0].functionDeclarations[0].parametersJsonSchema' must be an object"),
    ({"contents": [{"parts": [{"text": "x"}]}], "tools": [{"functionDeclarations": [
        {"name": "f", "parameters": {"type": "OBJECT", "properties": {"a": {"type": "TEXT"}}}}]}]},
     "'tools[0].functionDeclarations[0].parameters.properties.a.type' must be one of"),
    ({"contents": [{"parts": [{"text": "x"}]}], "tools": [{"functionDeclarations": [
        {"name": "f", "parameters": {"type": "OBJECT"}, "parametersJsonSchema": {"type": "object"}}]}]},
     "both 'parameters' and 'parametersJsonSchema'"),
    ({"contents": [{"parts": [{"text": "x"}]}], "tools": [{"functionDeclarations": [{"name": "f"}, {"name": "f"}]}]},
     "declared twice"),
    ({"contents": [{"parts": [{"text": "x"}]}], "tools": [{"mcpServers": []}]}, "'tools[0].mcpServers' is not a tool"),
    ({"contents": [{"parts": [{"text": "x"}]}], "tools": [{"functionDeclarations": [{"name": "f"}]}],
      "toolConfig": {"functionCallingConfig": {"mode": "VALIDATED"}}}, "VALIDATED has no chat equivalent"),
    ({"contents": [{"parts": [{"text": "x"}]}], "tools": [{"functionDeclarations": [{"name": "f"}, {"name": "h"}]}],
      "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["f", "h"]}}},
     "name exactly one declared function"),
])
def test_what_cannot_be_expressed_is_refused_naming_it(body, needle):
    with pytest.raises(DialectError) as caught:
        g.to_chat_request(body)
    assert needle in str(caught.value), str(caught.value)


def test_alt_and_the_stream_path():
    assert g.request_settings("sse", True) is True and g.request_settings(None, False) is False
    assert g.request_settings("json", False) is False
    with pytest.raises(DialectError, match=r"add '\?alt=sse'"):
        g.request_settings(None, True)
    with pytest.raises(DialectError, match="alt='sse'"):
        g.request_settings("sse", False)


def test_count_tokens_requests_translate_like_generate_requests():
    plain = g.count_chat_request({"contents": CLI_TURN_3["contents"]}, model="m")
    assert plain["messages"] == g.to_chat_request({"contents": CLI_TURN_3["contents"]})["messages"]
    wrapped = g.count_chat_request({"generateContentRequest": {**CLI_TURN_3, "model": "models/m"}}, model="m")
    assert wrapped["messages"][0]["role"] == "system" and wrapped["tools"][0]["function"]["name"] == "run_shell_command"
    assert set(wrapped) <= {"model", "messages", "tools", "chat_template_kwargs", "add_generation_prompt",
                            "continue_final_message"}
    with pytest.raises(DialectError, match="not both"):
        g.count_chat_request({"contents": CLI_TURN_3["contents"], "generateContentRequest": CLI_TURN_3})


def test_untranslated_keys_are_listed():
    body = {**CLI_TURN_3, "safetySettings": [], "labels": {"a": "b"}, "toolConfig": {"retrievalConfig": {}}}
    assert g.dropped_keys(body) == ["safetySettings", "labels", "toolConfig.retrievalConfig"]
