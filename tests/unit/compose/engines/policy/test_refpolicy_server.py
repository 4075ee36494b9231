"""vLLM 0.34 wire shapes of the reference policy server (stack.md §5; where 0.33 differs: test_refpolicy_releases.py)."""

from __future__ import annotations

import json

import pytest

from compose.engines.policy.testkit import BASH, TOOLS, chat, chat_stream, user_turn
from compose.engines.policy.tokenizer import IM_END, get_tokenizer

TOK = get_tokenizer()
CHOICE_KEYS = {"index", "message", "logprobs", "finish_reason", "stop_reason", "token_ids",
               "routed_experts", "weight_versions"}
TOP_KEYS = {"id", "object", "created", "model", "choices", "service_tier", "system_fingerprint",
            "usage", "prompt_logprobs", "prompt_token_ids", "prompt_text", "kv_transfer_params",
            "ec_transfer_params", "metrics"}
MESSAGE_KEYS = {"role", "content", "refusal", "audio", "function_call", "reasoning"}  # 0.34: no null annotations


async def test_non_streaming_with_token_ids_and_logprobs(client):
    data = await chat(client, model="tokentrail-policy", messages=user_turn(), return_token_ids=True, logprobs=True)
    assert set(data) == TOP_KEYS
    assert data["system_fingerprint"].startswith("vllm-0.34.0-")
    assert data["ec_transfer_params"] is None and data["metrics"] is None
    assert data["id"].startswith("chatcmpl-") and data["object"] == "chat.completion"
    assert data["model"] == "tokentrail-policy"
    choice = data["choices"][0]
    assert set(choice) == CHOICE_KEYS
    assert set(choice["message"]) == MESSAGE_KEYS  # tool_calls omitted: no calls
    assert choice["message"]["role"] == "assistant" and choice["message"]["reasoning"] is None
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] is None
    assert choice["routed_experts"] is None and choice["weight_versions"] is None
    ids, prompt = choice["token_ids"], data["prompt_token_ids"]
    assert ids[-1] == IM_END and TOK.decode(ids[:-1]) == choice["message"]["content"]
    assert TOK.decode(prompt).endswith("<|im_start|>assistant\n")
    entries = choice["logprobs"]["content"]
    assert len(entries) == len(ids)
    for token_id, entry in zip(ids, entries):
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        assert entry["token"] == TOK.token_str(token_id)
        assert entry["bytes"] == list(entry["token"].encode()) and entry["top_logprobs"] == []
    assert data["usage"] == {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + len(ids),
                             "completion_tokens": len(ids),
                             "completion_tokens_details": None}  # no reasoning parser; 0.34 omits prompt_tokens_details


async def test_without_flags_the_vendor_fields_are_null(client):
    data = await chat(client, messages=user_turn())
    assert data["prompt_token_ids"] is None and data["prompt_logprobs"] is None
    choice = data["choices"][0]
    assert choice["token_ids"] is None and choice["logprobs"] is None


async def test_top_logprobs_lists_the_sampled_token_then_the_best(client):
    data = await chat(client, messages=user_turn(), logprobs=True, top_logprobs=5)
    for entry in data["choices"][0]["logprobs"]["content"]:
        top = entry["top_logprobs"]
        assert len(top) == 5 and top[0]["logprob"] == entry["logprob"]
        assert top[0]["token"] == entry["token"]
        rest = [t["logprob"] for t in top[1:]]
        assert rest == sorted(rest, reverse=True) and rest[0] > -3.0 * 2.5


async def test_tokens_as_token_ids(client):
    data = await chat(client, messages=user_turn(), logprobs=True, return_token_ids=True,
                      return_tokens_as_token_ids=True)
    choice = data["choices"][0]
    assert [e["token"] for e in choice["logprobs"]["content"]] == [f"token_id:{i}" for i in choice["token_ids"]]


async def test_tool_call_message(client):
    data = await chat(client, messages=user_turn(), tools=[BASH], return_token_ids=True)
    choice = data["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] is None
    (call,) = message["tool_calls"]
    assert set(call) == {"id", "type", "function"} and call["type"] == "function"
    assert call["id"].startswith("chatcmpl-tool-") and len(call["id"]) == len("chatcmpl-tool-") + 32
    assert call["function"] == {"name": "Bash", "arguments": '{"command": "echo tokentrail-1"}'}


def collect(chunks: list[dict]) -> dict:
    """Concatenate a stream the way a client does."""
    out = {"token_ids": [], "logprobs": [], "content": "", "reasoning": "", "calls": {}, "finish": None}
    for chunk in chunks:
        for choice in chunk["choices"]:
            out["token_ids"] += choice.get("token_ids") or []
            out["logprobs"] += (choice.get("logprobs") or {}).get("content") or []
            delta = choice["delta"]
            out["content"] += delta.get("content") or ""
            out["reasoning"] += delta.get("reasoning") or ""
            for call in delta.get("tool_calls") or ():
                slot = out["calls"].setdefault(call["index"], {"id": None, "name": "", "arguments": ""})
                slot["id"] = call.get("id") or slot["id"]
                fn = call.get("function") or {}
                slot["name"] += fn.get("name") or ""
                slot["arguments"] += fn.get("arguments") or ""
            out["finish"] = choice["finish_reason"] or out["finish"]
    return out


@pytest.mark.parametrize("tools", [None, TOOLS], ids=["answer", "tool-call"])
@pytest.mark.parametrize("reasoning", [False, True], ids=["plain", "reasoning"])
async def test_stream_equals_non_stream(make_client, tools, reasoning):
    client = make_client(reasoning=reasoning)
    body = dict(messages=user_turn(), tools=tools, seed=42, return_token_ids=True, logprobs=True,
                top_logprobs=2, stream_options={"include_usage": True})
    full = await chat(client, **{k: v for k, v in body.items() if k != "stream_options"})
    chunks = await chat_stream(client, **body)
    got = collect(chunks)
    choice = full["choices"][0]
    assert got["token_ids"] == choice["token_ids"]
    assert got["logprobs"] == choice["logprobs"]["content"]  # same floats, same entries
    assert got["content"] == (choice["message"]["content"] or "")
    assert got["reasoning"] == (choice["message"]["reasoning"] or "")
    assert got["finish"] == choice["finish_reason"]
    calls = [(c["name"], c["arguments"]) for c in got["calls"].values()]
    assert calls == [(c["function"]["name"], c["function"]["arguments"])
                     for c in choice["message"].get("tool_calls", [])]
    assert chunks[0]["prompt_token_ids"] == full["prompt_token_ids"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {
        k: v for k, v in full["usage"].items() if v is not None}  # the usage chunk drops nulls
    assert chunks[-1]["system_fingerprint"] == full["system_fingerprint"]
    if reasoning:
        assert full["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0


async def test_stream_chunk_shapes(client):
    chunks = await chat_stream(client, messages=user_turn(), tools=[BASH], return_token_ids=True)
    first, *middle, last = chunks
    assert set(first) == {"id", "object", "created", "model", "choices", "prompt_token_ids", "prompt_text"}
    assert first["object"] == "chat.completion.chunk" and first["prompt_text"] is None
    assert first["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                 "logprobs": None, "finish_reason": None}]
    assert len({c["id"] for c in chunks}) == 1
    for chunk in middle:
        assert set(chunk) == {"id", "object", "created", "model", "choices", "kv_transfer_params"}
        assert chunk["kv_transfer_params"] is None
        (choice,) = chunk["choices"]
        assert set(choice) == {"index", "delta", "logprobs", "finish_reason", "token_ids"}
        assert choice["finish_reason"] is None and choice["logprobs"] is None
        assert len(choice["token_ids"]) == 1  # a chunk per id, even without a text delta
    (choice,) = last["choices"]
    assert set(choice) == {"index", "delta", "logprobs", "finish_reason", "stop_reason", "token_ids",
                           "weight_versions"}
    assert choice["weight_versions"] is None  # always on the terminal chunk, null unless requested
    assert set(last) == {"id", "object", "created", "model", "choices", "kv_transfer_params", "system_fingerprint"}
    assert choice["finish_reason"] == "tool_calls" and choice["delta"] == {}
    assert choice["token_ids"] == [IM_END]
    deltas = [c["choices"][0]["delta"] for c in middle if c["choices"][0]["delta"]]
    first_call = deltas[0]["tool_calls"][0]
    assert deltas[0]["content"] is None
    assert set(first_call) == {"id", "type", "index", "function"} and first_call["function"] == {"name": "Bash"}
    assert all(set(d["tool_calls"][0]) == {"index", "function"} for d in deltas[1:])


async def test_stream_without_token_ids_skips_markup_chunks(client):
    chunks = await chat_stream(client, messages=user_turn(), tools=[BASH])
    assert chunks[0]["prompt_token_ids"] is None
    for chunk in chunks[1:]:
        choice = chunk["choices"][0]
        assert choice["token_ids"] is None
        assert choice["delta"] or choice["finish_reason"]  # no empty chunk before the end


async def test_include_reasoning_false_suppresses_ids_and_logprobs(make_client):
    client = make_client(reasoning=True)
    data = await chat(client, messages=user_turn(), return_token_ids=True, logprobs=True,
                      include_reasoning=False)
    choice = data["choices"][0]
    assert choice["token_ids"] is None and choice["logprobs"] is None
    assert choice["message"]["reasoning"] is None and choice["message"]["content"]
    chunks = await chat_stream(client, messages=user_turn(), return_token_ids=True, logprobs=True,
                               include_reasoning=False)
    assert all(c["choices"][0]["token_ids"] is None for c in chunks[1:])
    assert not any("reasoning" in c["choices"][0]["delta"] for c in chunks)


async def test_weight_versions_and_the_admin_route(client):
    # vLLM's engine labels every output "default" until a trainer names the weights
    data = await chat(client, messages=user_turn(), return_token_ids=True, return_weight_versions=True)
    n = len(data["choices"][0]["token_ids"])
    assert data["choices"][0]["weight_versions"] == [{"version": "default", "start": 0, "end": n}]
    assert (await client.get("/tokentrail/admin/weight-version")).json() == {"weight_version": "default"}
    response = await client.post("/tokentrail/admin/weight-version", json={"version": 7})
    assert response.json() == {"weight_version": "7"}  # labels are strings; an integer is its decimal label
    assert (await client.get("/weight_info")).json() == {"weight_version": "7"}
    chunks = await chat_stream(client, messages=user_turn(), return_token_ids=True, return_weight_versions=True)
    n = sum(len(c["choices"][0]["token_ids"]) for c in chunks[1:])
    assert chunks[-1]["choices"][0]["weight_versions"] == [{"version": "7", "start": 0, "end": n}]
    assert all("weight_versions" not in c["choices"][0] for c in chunks[:-1])
    bad = await client.post("/tokentrail/admin/weight-version", json={"version": -1})
    assert bad.status_code == 400


async def test_vllm_dev_mode_weight_version_routes(client):
    r = await client.post("/update_weight_version", json={"new_version": "step-12"})
    assert r.json() == {"success": True, "new_version": "step-12"}
    assert (await client.get("/weight_info")).json() == {"weight_version": "step-12"}
    data = await chat(client, messages=user_turn(), return_weight_versions=True, return_token_ids=True)
    assert data["choices"][0]["weight_versions"][0]["version"] == "step-12"
    assert (await client.get("/tokentrail/admin/weight-version")).json() == {"weight_version": "step-12"}
    # FastAPI's validation of an embedded string body, as vLLM renders it
    wrong = await client.post("/update_weight_version", json={"new_version": 7})
    assert wrong.status_code == 400 and wrong.json()["error"] == {
        "message": "1 validation error:\n  {'type': 'string_type', 'loc': 'body.new_version', "
                   "'msg': 'Input should be a valid string', 'input': '7'}",
        "type": "Bad Request", "param": "body.new_version", "code": 400}
    missing = await client.post("/update_weight_version", json={})
    assert missing.json()["error"]["param"] == "body.new_version"
    r = await client.post("/finish_weight_update", json={"weight_version": "step-13"})
    assert r.json() == {"message": "Weight update finished"}
    assert (await client.get("/weight_info")).json() == {"weight_version": "step-13"}


async def test_dev_mode_routes_can_be_left_out(make_client):
    client = make_client(dev_mode=False)
    for method, path in (("POST", "/pause"), ("POST", "/update_weight_version"), ("GET", "/weight_info")):
        assert (await client.request(method, path)).status_code == 404
    assert (await client.get("/tokentrail/admin/weight-version")).status_code == 200


async def test_scoring_route_reproduces_generated_logprobs(client):
    for version in ("default", "3", "step-9"):
        await client.post("/update_weight_version", json={"new_version": version})
        data = await chat(client, messages=user_turn(), tools=TOOLS, return_token_ids=True, logprobs=True)
        prompt, ids = data["prompt_token_ids"], data["choices"][0]["token_ids"]
        logprobs = [e["logprob"] for e in data["choices"][0]["logprobs"]["content"]]
        await client.post("/tokentrail/admin/weight-version", json={"version": 99})
        scored = await client.post("/tokentrail/score", json={
            "token_ids": prompt + ids, "start": len(prompt), "weight_version": version})
        assert scored.json() == {"logprobs": logprobs, "weight_version": version}
        current = await client.post("/tokentrail/score", json={"token_ids": prompt + ids, "start": len(prompt)})
        assert current.json()["weight_version"] == "99" and current.json()["logprobs"] != logprobs
    # an integer weight version is its decimal label, and its table is the same
    as_int = await client.post("/tokentrail/score", json={"token_ids": [1, 5, 7], "start": 1, "weight_version": 3})
    as_str = await client.post("/tokentrail/score", json={"token_ids": [1, 5, 7], "start": 1, "weight_version": "3"})
    assert as_int.json() == as_str.json()


@pytest.mark.parametrize("body,param", [
    ({"token_ids": [1, -5]}, "token_ids"), ({"token_ids": [1, 2], "start": 3}, "start"),
    ({"token_ids": [1], "weight_version": -1}, "weight_version"), ({"token_ids": "no"}, "token_ids"),
])
async def test_scoring_route_validates(client, body, param):
    response = await client.post("/tokentrail/score", json=body)
    assert response.status_code == 400 and response.json()["error"]["param"] == param


async def test_n_choices_like_vllm(client):
    body = dict(messages=user_turn(), n=3, seed=4, return_token_ids=True, logprobs=True)
    full = await chat(client, **body)
    assert [c["index"] for c in full["choices"]] == [0, 1, 2]
    ids = [c["token_ids"] for c in full["choices"]]
    assert len({tuple(i) for i in ids}) == 3  # independent samples
    assert full["usage"]["completion_tokens"] == sum(map(len, ids))
    one = await chat(client, **{**body, "n": 1})
    assert one["choices"][0]["token_ids"] == ids[0]
    chunks = await chat_stream(client, **body)
    firsts = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("role")]
    assert [c["choices"][0]["index"] for c in firsts] == [0, 1, 2]
    assert all(c["prompt_token_ids"] == full["prompt_token_ids"] for c in firsts)  # one first chunk per choice
    for i in range(3):
        streamed = collect([{**c, "choices": [ch for ch in c["choices"] if ch["index"] == i]} for c in chunks])
        assert streamed["token_ids"] == ids[i]
        assert streamed["finish"] == full["choices"][i]["finish_reason"]
    response = await client.post("/v1/chat/completions", json={"messages": user_turn(), "n": 0})
    assert response.status_code == 400
    assert response.json()["error"] == {"message": "n must be at least 1, got 0.", "type": "BadRequestError",
                                        "param": None, "code": 400}


# vLLM's params: a VLLMValidationError names the field; a pydantic field error says body.<field>
@pytest.mark.parametrize("body,param", [
    ({"top_logprobs": 2}, "top_logprobs"), ({"logprobs": True, "top_logprobs": 21}, "logprobs"),
    ({"stream_options": {"include_usage": True}}, "stream_options"), ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 10**6}, "max_tokens"), ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [BASH], "tool_choice": {"type": "function", "function": {"name": "Nope"}}}, "tool_choice"),
    ({"temperature": "hot"}, "body.temperature"), ({"messages": "hi"}, "body.messages"),
    ({"messages": [{"content": "no role"}]}, "body.messages.0.role"),
    ({"tools": [{"type": "function"}]}, "body.tools.0.function"),
    ({"temperature": 2.5}, "temperature"), ({"prompt_logprobs": -2}, "prompt_logprobs"),
])
async def test_invalid_requests_get_vllm_errors(client, body, param):
    response = await client.post("/v1/chat/completions", json={"messages": user_turn(), **body})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


@pytest.mark.parametrize("body,message", [
    ({"prompt_logprobs": 1, "stream": True}, "`prompt_logprobs` are not available when `stream=True`. "
                                             "(parameter=prompt_logprobs)"),
    ({"prompt_logprobs": -1, "stream": True}, "`prompt_logprobs` are not available when `stream=True`. "
                                              "(parameter=prompt_logprobs)"),
    ({"tool_choice": "required"}, "When using `tool_choice`, `tools` must be set. (parameter=tool_choice)"),
    ({"max_tokens": 40000}, "max_tokens=40000 cannot be greater than max_model_len=32768. Please request "
                            "fewer output tokens. (parameter=max_tokens, value=40000)"),
    ({"max_tokens": 0}, "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)"),
    ({"temperature": "hot"}, "1 validation error:\n  {'type': 'float_parsing', 'loc': 'body.temperature', "
                             "'msg': 'Input should be a valid number, unable to parse string as a number', "
                             "'input': 'hot'}"),
])
async def test_vllm_error_texts(client, body, message):
    response = await client.post("/v1/chat/completions", json={"messages": user_turn(), **body})
    assert response.status_code == 400 and response.json()["error"]["message"] == message


async def test_content_type_must_be_json(client):
    for headers in ({"content-type": "text/plain"}, {}):
        response = await client.post("/v1/chat/completions", content=json.dumps({"messages": user_turn()}),
                                     headers=headers)
        assert response.status_code == 400
        assert response.json() == {"error": {
            "message": "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed",
            "type": "Bad Request", "param": None, "code": 400}}
    ok = await client.post("/v1/chat/completions", content=json.dumps({"messages": user_turn()}),
                           headers={"content-type": "application/json; charset=utf-8"})
    assert ok.status_code == 200


async def test_prompt_logprobs_have_vllms_shape(client):
    data = await chat(client, messages=user_turn(), prompt_logprobs=2, return_token_ids=True)
    prompt, plp = data["prompt_token_ids"], data["prompt_logprobs"]
    assert len(plp) == len(prompt) and plp[0] is None
    for token, entry in zip(prompt[1:], plp[1:]):
        mine = entry[str(token)]
        assert set(mine) == {"logprob", "rank", "decoded_token"} and mine["decoded_token"] == TOK.token_str(token)
        assert 2 <= len(entry) <= 3 and mine["rank"] >= 1
        assert all(v["rank"] <= mine["rank"] for k, v in entry.items() if k != str(token))
    scored = (await client.post("/tokentrail/score", json={"token_ids": prompt, "start": 1})).json()["logprobs"]
    assert [e[str(t)]["logprob"] for t, e in zip(prompt[1:], plp[1:])] == scored


async def test_engine_refusals_come_after_a_stream_has_started(client):
    # vLLM's engine checks max_logprobs when the request is added: mid-stream for a stream
    full = await client.post("/v1/chat/completions", json={"messages": user_turn(), "logprobs": True,
                                                           "top_logprobs": 21})
    assert full.status_code == 400 and full.json()["error"]["message"] == (
        "Requested sample logprobs of 21, which is greater than max allowed: 20 (parameter=logprobs, value=21)")
    streamed = await client.post("/v1/chat/completions", json={"messages": user_turn(), "logprobs": True,
                                                               "top_logprobs": 21, "stream": True})
    assert streamed.status_code == 200
    events = [e for e in streamed.text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]" and json.loads(events[0][6:])["error"]["param"] == "logprobs"


async def test_context_window_rules(make_client):
    client = make_client(max_model_len=300)
    prompt_len = len((await client.post("/tokenize", json={"messages": user_turn()})).json()["tokens"])
    # a budget that does not fit next to the prompt is clamped, as vLLM's get_max_tokens does
    data = await chat(client, messages=user_turn(), max_tokens=300 - prompt_len + 5, ignore_eos=True,
                      return_token_ids=True)
    assert len(data["choices"][0]["token_ids"]) == 300 - prompt_len
    assert data["choices"][0]["finish_reason"] == "length"
    # no budget: what is left
    data = await chat(client, messages=user_turn(), ignore_eos=True, return_token_ids=True)
    assert len(data["choices"][0]["token_ids"]) == 300 - prompt_len
    long = user_turn("word " * 400)
    response = await client.post("/v1/chat/completions", json={"messages": long})
    assert response.status_code == 400
    assert response.json()["error"] == {
        "message": "This model's maximum context length is 300 tokens. However, your prompt contains at least "
                   "301 input tokens, which exceeds this limit even without any output tokens. Please reduce "
                   "the length of the input prompt. (parameter=input_tokens, value=301)",
        "type": "BadRequestError", "param": "input_tokens", "code": 400}


async def test_unknown_routes_answer_like_fastapi(client):
    missing = await client.get("/v1/nope")
    assert missing.status_code == 404 and missing.json() == {"detail": "Not Found"}
    wrong = await client.get("/v1/chat/completions")
    assert wrong.status_code == 405 and wrong.json() == {"detail": "Method Not Allowed"}


async def test_thinking_can_be_switched_per_request(make_client):
    on = make_client(reasoning=True)
    off = await chat(on, messages=user_turn(), chat_template_kwargs={"enable_thinking": False})
    assert off["choices"][0]["message"]["reasoning"] is None
    plain = make_client()
    thinking = await chat(plain, messages=user_turn(), chat_template_kwargs={"enable_thinking": True})
    assert thinking["choices"][0]["message"]["reasoning"]


async def test_invalid_json_is_a_400(client):
    response = await client.post("/v1/chat/completions", content=b"{not json",
                                 headers={"content-type": "application/json"})
    assert response.status_code == 400 and response.json()["error"] == {
        "message": "1 validation error:\n  {'type': 'json_invalid', 'loc': 'body.1', 'msg': 'JSON decode error', "
                   "'input': '<dict of 0 items>', 'ctx': {'error': 'Expecting property name enclosed in double "
                   "quotes'}}", "type": "Bad Request", "param": "body.1", "code": 400}


async def test_model_names(make_client):
    lenient = make_client(strict_model=False)
    assert (await chat(lenient, model="gpt-4o", messages=user_turn()))["model"] == "tokentrail-policy"
    strict = make_client(served_model_name="policy-a")  # vLLM's behaviour is the default
    response = await strict.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": user_turn()})
    assert response.status_code == 404
    assert response.json() == {"error": {"message": "The model `gpt-4o` does not exist.",
                                         "type": "NotFoundError", "param": "model", "code": 404}}
    assert (await chat(strict, model="policy-a", messages=user_turn()))["model"] == "policy-a"
    assert (await chat(strict, messages=user_turn()))["model"] == "policy-a"  # no name: the served one
    assert (await strict.post("/tokenize", json={"model": "gpt-4o", "prompt": "x"})).status_code == 404


async def test_models_health_tokenize_detokenize(client):
    models = (await client.get("/v1/models")).json()
    assert models["object"] == "list" and models["data"][0]["id"] == "tokentrail-policy"
    assert models["data"][0]["object"] == "model" and models["data"][0]["max_model_len"] == 32768
    health = await client.get("/health")
    assert health.status_code == 200 and health.content == b""
    tokens = (await client.post("/tokenize", json={"prompt": "good world<|im_end|>"})).json()
    assert tokens == {"count": 3, "max_model_len": 32768, "tokens": TOK.encode("good world<|im_end|>"),
                      "token_strs": None}
    rendered = (await client.post("/tokenize", json={"messages": user_turn(), "tools": [BASH]})).json()
    data = await chat(client, messages=user_turn(), tools=[BASH], return_token_ids=True)
    assert rendered["tokens"] == data["prompt_token_ids"]
    text = (await client.post("/detokenize", json={"tokens": tokens["tokens"]})).json()
    assert text == {"prompt": "good world<|im_end|>"}
    bad = await client.post("/detokenize", json={"tokens": [10**9]})
    assert bad.status_code == 400


async def test_ignore_eos_benchmark_shape(client):
    data = await chat(client, messages=user_turn(), max_tokens=512, ignore_eos=True, return_token_ids=True)
    choice = data["choices"][0]
    assert len(choice["token_ids"]) == 512 and choice["finish_reason"] == "length"
    assert data["usage"]["completion_tokens"] == 512


async def test_stop_string_truncates_content_in_both_shapes(client):
    base = await chat(client, messages=user_turn(), seed=5)
    words = base["choices"][0]["message"]["content"].split()
    stop = " " + words[3]
    full = await chat(client, messages=user_turn(), seed=5, stop=[stop])
    choice = full["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop
    assert choice["message"]["content"] == " ".join(words[:3])
    streamed = collect(await chat_stream(client, messages=user_turn(), seed=5, stop=[stop]))
    assert streamed["content"] == " ".join(words[:3])


async def test_continuous_usage_and_prompt_text(client):
    chunks = await chat_stream(client, messages=user_turn(), return_prompt_text=True,
                               stream_options={"include_usage": True, "continuous_usage_stats": True})
    assert chunks[0]["prompt_text"].endswith("<|im_start|>assistant\n")
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[0] == 0
    full = await chat(client, messages=user_turn(), return_prompt_text=True)
    assert full["prompt_text"] == chunks[0]["prompt_text"]
    json.dumps(full)  # plain JSON types only


def test_the_answer_json_is_the_stdlib_encoders_numbers_and_refuses_a_non_finite_log_prob():
    from compose.engines.policy.protocol import completion_json, dumps

    answer = {"choices": [{"logprobs": {"content": [{"token": "é", "logprob": -1e-05, "bytes": [195, 169]},
                                                    {"token": "x", "logprob": -9999.0, "bytes": [120]}]},
                           "message": {"content": "é\u2028", "tool_calls": []}}], "prompt_token_ids": [0, 2**32 - 1],
              "service_tier": None}
    assert json.loads(completion_json(answer)) == json.loads(dumps(answer)) == answer
    answer["choices"][0]["logprobs"]["content"][1]["logprob"] = float("nan")
    with pytest.raises(ValueError, match="non-finite log-prob"):
        completion_json(answer)
