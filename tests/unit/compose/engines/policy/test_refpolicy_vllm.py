"""Where the reference policy server follows vLLM 0.33 beyond the basic shapes (vllm_0.33.md §1, §3).

Pause / abort and resume, the repetition finish, forced tool choice as constrained JSON,
parallel_tool_calls=false, the "tool_calls" finish rule, Hermes argument re-serialisation,
the reasoning usage details, and the render route.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from compose.engines.policy import tokenizer as tk
from compose.engines.policy.parsing import OutputParser, parse_output
from compose.engines.policy.testkit import BASH, READ, TOOLS, chat, chat_stream, parse_sse, user_turn
from compose.engines.policy.tokenizer import IM_END, get_tokenizer

TOK = get_tokenizer()
LONG = dict(messages=user_turn(), max_tokens=60, ignore_eos=True, return_token_ids=True, logprobs=True, seed=1)


async def _soon(coro, delay: float = 0.15):
    task = asyncio.ensure_future(coro)
    await asyncio.sleep(delay)
    return task


@pytest.fixture
async def slow(make_client):
    """A server whose generations take time (10 ms a token), warmed up so a request starts at once."""
    client = make_client(decode_ms_per_token=10)
    await chat(client, messages=user_turn(), max_tokens=1)
    return client


# -- pause / resume ----------------------------------------------------------------------

async def test_pause_aborts_a_generation_in_flight_and_holds_new_ones_until_resume(slow):
    client = slow
    task = await _soon(chat(client, **LONG))
    assert (await client.post("/pause")).json() == {"status": "paused"}  # mode=abort is vLLM's default
    data = await asyncio.wait_for(task, 5)
    choice = data["choices"][0]
    assert choice["finish_reason"] == "abort" and choice["stop_reason"] is None
    assert 0 < len(choice["token_ids"]) < 60 == LONG["max_tokens"]
    assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])
    assert data["usage"]["completion_tokens"] == len(choice["token_ids"])
    assert (await client.get("/is_paused")).json() == {"is_paused": True}
    waiting = await _soon(chat(client, **{**LONG, "max_tokens": 5}))
    assert not waiting.done()  # vLLM queues new requests while paused
    assert (await client.post("/resume")).json() == {"status": "resumed"}
    after = await asyncio.wait_for(waiting, 5)
    assert after["choices"][0]["finish_reason"] == "length"
    assert (await client.get("/is_paused")).json() == {"is_paused": False}


async def test_a_stream_aborted_by_pause_ends_with_an_abort_chunk(slow):
    client = slow
    task = await _soon(chat_stream(client, **LONG, stream_options={"include_usage": True}))
    await client.post("/pause", params={"mode": "abort"})
    chunks = await asyncio.wait_for(task, 5)
    *tokens, terminal, usage = chunks[1:]
    assert all(c["choices"][0]["finish_reason"] is None for c in tokens)
    (choice,) = terminal["choices"]
    assert choice["finish_reason"] == "abort" and choice["delta"] == {} and choice["token_ids"] == []
    assert choice["logprobs"] == {"content": []} and "weight_versions" in choice
    generated = [i for c in tokens for i in c["choices"][0]["token_ids"]]
    assert 0 < len(generated) < 60 and usage["usage"]["completion_tokens"] == len(generated)
    await client.post("/resume")
    full = await chat(client, **{**LONG, "stream": False})
    assert full["choices"][0]["token_ids"][: len(generated)] == generated  # the same generation, cut


async def test_pause_keep_freezes_and_resume_continues_the_same_generation(make_client):
    client = make_client(decode_ms_per_token=5)
    reference = await chat(client, **{**LONG, "max_tokens": 30})
    task = await _soon(chat(client, **{**LONG, "max_tokens": 30}), 0.05)
    await client.post("/pause", params={"mode": "keep"})
    await asyncio.sleep(0.3)
    assert not task.done()
    await client.post("/resume")
    data = await asyncio.wait_for(task, 5)
    assert data["choices"][0]["token_ids"] == reference["choices"][0]["token_ids"]
    assert data["choices"][0]["finish_reason"] == "length"


async def test_pause_wait_returns_once_generations_in_flight_are_done(make_client):
    client = make_client(decode_ms_per_token=5)
    task = await _soon(chat(client, **{**LONG, "max_tokens": 30}), 0.05)
    await client.post("/pause", params={"mode": "wait"})
    assert task.done() and task.result()["choices"][0]["finish_reason"] == "length"
    await client.post("/resume")


async def test_pause_mode_is_validated_like_fastapi_does_for_vllm(client):
    response = await client.post("/pause", params={"mode": "later"})
    assert response.status_code == 400 and response.json()["error"] == {
        "message": "1 validation error:\n  {'type': 'literal_error', 'loc': 'query.mode', 'msg': \"Input should be "
                   "'abort', 'wait' or 'keep'\", 'input': 'later', 'ctx': {'expected': \"'abort', 'wait' or 'keep'\"}}",
        "type": "Bad Request", "param": "query.mode", "code": 400}
    assert (await client.get("/pause")).status_code == 405


async def test_abort_requests_without_ids_aborts_everything_in_flight(slow):
    client = slow
    task = await _soon(chat(client, **LONG))
    assert (await client.post("/abort_requests", json={})).json() == {"status": "aborted", "aborted": 1}
    assert (await asyncio.wait_for(task, 5))["choices"][0]["finish_reason"] == "abort"
    assert (await client.get("/is_paused")).json() == {"is_paused": False}


@pytest.mark.parametrize("stream", [False, True])
async def test_repetition_fault_finishes_with_repetition(make_client, stream):
    client = make_client(faults={"repetition"})
    if stream:
        chunks = await chat_stream(client, messages=user_turn(), return_token_ids=True)
        assert chunks[-1]["choices"][0]["finish_reason"] == "repetition"
        return
    data = await chat(client, messages=user_turn(), return_token_ids=True)
    choice = data["choices"][0]
    assert choice["finish_reason"] == "repetition" and IM_END not in choice["token_ids"]
    words = choice["message"]["content"].split()
    assert len(words) >= 12 and len(set(words[1:])) <= 2  # a start word, then one phrase over and over


# -- tool calls --------------------------------------------------------------------------

NAMED = {"type": "function", "function": {"name": "Read"}}


async def test_required_tool_choice_is_vllms_constrained_json(client):
    data = await chat(client, messages=user_turn(), tools=TOOLS, tool_choice="required", return_token_ids=True)
    choice = data["choices"][0]
    text = TOK.decode(choice["token_ids"])
    assert text == '[{"name": "Bash", "parameters": {"command": "echo tokentrail-1"}}]<|im_end|>'
    assert tk.TOOL_CALL not in choice["token_ids"]
    (call,) = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "Bash", "arguments": '{"command": "echo tokentrail-1"}'}
    assert choice["message"]["content"] == "" and choice["finish_reason"] == "tool_calls"


async def test_named_tool_choice_writes_the_arguments_and_finishes_with_stop(client):
    data = await chat(client, messages=user_turn(), tools=TOOLS, tool_choice=NAMED, return_token_ids=True)
    choice = data["choices"][0]
    args = TOK.decode(choice["token_ids"][:-1])
    assert json.loads(args)["file_path"] == "/tmp/tokentrail-1.txt" and choice["token_ids"][-1] == IM_END
    (call,) = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "Read", "arguments": args}  # the text itself, not re-serialised
    assert choice["finish_reason"] == "stop"  # vLLM: "tool_calls" never for a tool forced by name


@pytest.mark.parametrize("tool_choice", ["required", NAMED], ids=["required", "named"])
async def test_forced_tool_choice_streams_like_vllm(client, tool_choice):
    body = dict(messages=user_turn(), tools=TOOLS, tool_choice=tool_choice, return_token_ids=True)
    full = (await chat(client, **body))["choices"][0]
    chunks = await chat_stream(client, **body)
    deltas = [c["choices"][0]["delta"] for c in chunks[1:] if c["choices"][0]["delta"].get("tool_calls")]
    first = deltas[0]["tool_calls"][0]
    assert set(first) == {"id", "type", "index", "function"} and "content" not in deltas[0]
    assert first["function"]["name"] == full["message"]["tool_calls"][0]["function"]["name"]
    arguments = "".join(tc["function"]["arguments"] for d in deltas for tc in d["tool_calls"])
    assert arguments == full["message"]["tool_calls"][0]["function"]["arguments"]
    assert [i for c in chunks[1:] for i in c["choices"][0]["token_ids"]] == full["token_ids"]
    assert chunks[-1]["choices"][0]["finish_reason"] == full["finish_reason"]


async def test_forced_tool_choice_can_emit_markup_instead(make_client):
    client = make_client(forced_tool_format="markup")
    data = await chat(client, messages=user_turn(), tools=TOOLS, tool_choice="required", return_token_ids=True)
    choice = data["choices"][0]
    assert choice["token_ids"][0] == tk.TOOL_CALL and choice["message"]["tool_calls"]
    assert choice["message"]["content"] == "" and choice["finish_reason"] == "tool_calls"


async def test_parallel_tool_calls_false_keeps_the_first_call_but_every_id(client):
    messages = user_turn("Run three things. #parallel-calls=3")
    both = await chat(client, messages=messages, tools=[BASH], return_token_ids=True)
    assert [c["function"]["arguments"] for c in both["choices"][0]["message"]["tool_calls"]] == [
        '{"command": "echo tokentrail-1"}', '{"command": "echo tokentrail-2"}', '{"command": "echo tokentrail-3"}']
    one = await chat(client, messages=messages, tools=[BASH], return_token_ids=True, parallel_tool_calls=False)
    assert len(one["choices"][0]["message"]["tool_calls"]) == 1
    assert one["choices"][0]["token_ids"] == both["choices"][0]["token_ids"]
    assert one["choices"][0]["token_ids"].count(tk.TOOL_CALL) == 3
    chunks = await chat_stream(client, messages=messages, tools=[BASH], return_token_ids=True,
                               parallel_tool_calls=False)
    indices = {tc["index"] for c in chunks[1:] for tc in c["choices"][0]["delta"].get("tool_calls", [])}
    assert indices == {0}
    assert [i for c in chunks[1:] for i in c["choices"][0]["token_ids"]] == both["choices"][0]["token_ids"]


async def test_tool_calls_finish_reason_needs_the_engine_to_have_stopped(client):
    body = dict(messages=user_turn(), tools=[BASH], return_token_ids=True)
    full = (await chat(client, **body))["choices"][0]
    assert full["finish_reason"] == "tool_calls" and full["token_ids"][-1] == IM_END
    cut = await chat(client, **body, max_tokens=len(full["token_ids"]) - 1)  # the call complete, no EOS
    choice = cut["choices"][0]
    assert choice["message"]["tool_calls"] and choice["finish_reason"] == "length"
    chunks = await chat_stream(client, **body, max_tokens=len(full["token_ids"]) - 1)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_hermes_reserialises_arguments_but_streams_them_raw():
    ids = [tk.TOOL_CALL] + TOK.encode('{"name": "Bash", "arguments": {"command":"é"}}') + [tk.TOOL_CALL_END]
    parsed = parse_output(TOK, ids, tools_enabled=True)
    assert [(n, a) for _, n, a in parsed.tool_calls] == [("Bash", '{"command": "é"}')]  # json.dumps(...)
    parser = OutputParser(TOK, tools_enabled=True)
    deltas = [d for d in map(parser.feed, ids) if d]
    streamed = "".join(tc["function"].get("arguments") or "" for d in deltas for tc in d["tool_calls"])
    assert streamed == '{"command":"é"}'  # the raw fragments


def test_forced_json_that_does_not_validate_gives_no_calls():
    ids = TOK.encode('[{"name": "Bash", "parameters": {"command": "ec')
    parsed = parse_output(TOK, ids, tools_enabled=True, tool_choice="required", forced=True)
    assert parsed.tool_calls == []


# -- usage details and render -----------------------------------------------------------

async def test_reasoning_tokens_are_reported_with_a_reasoning_parser(make_client):
    client = make_client(reasoning=True)
    data = await chat(client, messages=user_turn(), return_token_ids=True)
    ids = data["choices"][0]["token_ids"]
    inside = ids.index(tk.THINK_END) - ids.index(tk.THINK) - 1
    assert data["usage"]["completion_tokens_details"] == {"reasoning_tokens": inside}
    chunks = await chat_stream(client, messages=user_turn(), stream_options={"include_usage": True})
    assert chunks[-1]["usage"]["completion_tokens_details"] == {"reasoning_tokens": inside}


RENDER_KEYS = {"request_id", "token_ids", "token_offsets", "features", "content_parts", "sampling_params", "model",
               "reasoning_ended", "reasoning_parser_kwargs", "return_token_ids", "output_mode", "stream",
               "stream_options", "cache_salt", "priority", "kv_transfer_params", "ec_transfer_params"}


async def test_render_returns_vllms_generate_request(client):
    body = {"model": "tokentrail-policy", "messages": user_turn(), "max_tokens": 7, "temperature": 0.5, "seed": 3,
            "stop": ["x"], "logprobs": True, "top_logprobs": 2, "return_token_ids": True}
    rendered = (await client.post("/v1/chat/completions/render", json=body,
                                  headers={"x-request-id": "abc"})).json()
    assert set(rendered) == RENDER_KEYS | {"parse_context"} and rendered["request_id"] == "chatcmpl-abc"
    assert rendered["parse_context"] == {  # 0.34's, for a derendering /inference/v1/generate
        "tools": None, "tool_choice": "none", "parallel_tool_calls": True, "include_reasoning": True,
        "chat_template_kwargs": {"add_generation_prompt": True, "continue_final_message": False},
        "history_tool_call_cnt": 0}
    # the same dict vLLM 0.32's GenerateRequest.model_dump() gives for this request
    assert rendered["sampling_params"] == {
        "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0, "temperature": 0.5,
        "top_p": 1.0, "min_p": 0.0, "seed": 3, "stop": ["x"], "stop_token_ids": [], "max_tokens": 7,
        "logprobs": 2, "output_kind": 2, "skip_clone": True, "bad_words": [], "skip_reading_prefix_cache": False}
    assert (rendered["model"], rendered["output_mode"], rendered["stream"], rendered["priority"]) == (
        "tokentrail-policy", "tokens", False, 0)
    assert rendered["reasoning_ended"] is None and rendered["reasoning_parser_kwargs"] is None
    data = await chat(client, **body)
    assert rendered["token_ids"] == data["prompt_token_ids"]
    supplied = (await client.post("/v1/chat/completions/render", json={
        "messages": user_turn(), "kv_transfer_params": {"prompt_token_ids": [1, 2, 3]}, "stream": True,
        "stream_options": {"include_usage": True}})).json()
    assert supplied["token_ids"] == [1, 2, 3] and supplied["sampling_params"]["max_tokens"] == 32768 - 3
    assert supplied["stream_options"] == {"include_usage": True, "continuous_usage_stats": False}
    assert supplied["sampling_params"]["output_kind"] == 1
    missing = await client.post("/v1/chat/completions/render", json={"model": "nope", "messages": user_turn()})
    assert missing.status_code == 404


async def test_render_with_a_reasoning_parser(make_client):
    client = make_client(reasoning=True)
    rendered = (await client.post("/v1/chat/completions/render", json={
        "messages": user_turn(), "tools": [READ], "chat_template_kwargs": {"enable_thinking": True}})).json()
    assert rendered["reasoning_ended"] is False
    assert rendered["reasoning_parser_kwargs"] == {"chat_template_kwargs": {
        "enable_thinking": True, "add_generation_prompt": True, "continue_final_message": False}}
    assert rendered["sampling_params"]["skip_special_tokens"] is False  # hermes keeps special tokens with tools
    hidden = (await client.post("/v1/chat/completions/render", json={
        "messages": user_turn(), "include_reasoning": False})).json()
    assert hidden["reasoning_ended"] is True


async def test_logprobs_modes_report_what_vllm_reports(make_client):
    body = dict(messages=user_turn(), logprobs=True, return_token_ids=True, seed=2, top_k=5, top_logprobs=2)
    raw = [e["logprob"] for e in (await chat(make_client(), **body))["choices"][0]["logprobs"]["content"]]
    logits = [e["logprob"] for e in (await chat(make_client(logprobs_mode="raw_logits"), **body))
              ["choices"][0]["logprobs"]["content"]]
    # unnormalised (not log-probabilities), computed in float32 as vLLM computes them
    assert logits == [float(np.float32(v) + np.float32(7.25)) for v in raw]
    processed = (await chat(make_client(logprobs_mode="processed_logprobs"), **body))["choices"][0]
    values = [e["logprob"] for e in processed["logprobs"]["content"]]
    assert processed["token_ids"] == (await chat(make_client(), **body))["choices"][0]["token_ids"]
    # after top_k=5 a token outside the five is impossible (vLLM's -inf, clamped to -9999.0) ...
    assert -9999.0 in values
    # ... and one inside has more mass than before the cut
    assert all(p >= r - 1e-9 for p, r in zip(values, raw) if p != -9999.0)


def test_sse_framing_helper_still_checks_done():
    with pytest.raises(AssertionError):
        parse_sse('data: {"a": 1}\n\n')


async def test_answer_words_directive_fixes_the_final_answers_length(client):
    # A compaction test needs a summary long enough to be recognised in the next prompt.
    for n in (3, 40):
        data = await chat(client, messages=user_turn(f"Summarise. #tool-calls=0 #answer-words={n}"),
                          return_token_ids=True)
        content = data["choices"][0]["message"]["content"]
        assert len(content.split()) == n + 1, content  # the sentence's first word, then n words
