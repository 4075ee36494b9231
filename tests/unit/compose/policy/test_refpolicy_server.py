"""vLLM 0.33 wire shapes of the reference policy server (stack.md §5)."""

from __future__ import annotations

import json

import pytest

from compose.policy.testkit import BASH, TOOLS, chat, chat_stream, user_turn
from compose.policy.tokenizer import IM_END, get_tokenizer

TOK = get_tokenizer()
CHOICE_KEYS = {"index", "message", "logprobs", "finish_reason", "stop_reason", "token_ids",
               "routed_experts", "weight_versions"}
TOP_KEYS = {"id", "object", "created", "model", "choices", "service_tier", "system_fingerprint",
            "usage", "prompt_logprobs", "prompt_token_ids", "prompt_text", "kv_transfer_params"}
MESSAGE_KEYS = {"role", "content", "refusal", "annotations", "audio", "function_call", "reasoning"}


async def test_non_streaming_with_token_ids_and_logprobs(client):
    data = await chat(client, model="anything", messages=user_turn(), return_token_ids=True, logprobs=True)
    assert set(data) == TOP_KEYS
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
                             "completion_tokens": len(ids), "prompt_tokens_details": None}


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
        k: v for k, v in full["usage"].items() if k != "prompt_tokens_details"}


async def test_stream_chunk_shapes(client):
    chunks = await chat_stream(client, messages=user_turn(), tools=[BASH], return_token_ids=True)
    first, *middle, last = chunks
    assert set(first) == {"id", "object", "created", "model", "choices", "prompt_token_ids", "prompt_text"}
    assert first["object"] == "chat.completion.chunk" and first["prompt_text"] is None
    assert first["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                 "logprobs": None, "finish_reason": None}]
    assert len({c["id"] for c in chunks}) == 1
    for chunk in middle:
        assert set(chunk) == {"id", "object", "created", "model", "choices"}
        (choice,) = chunk["choices"]
        assert set(choice) == {"index", "delta", "logprobs", "finish_reason", "token_ids"}
        assert choice["finish_reason"] is None and choice["logprobs"] is None
        assert len(choice["token_ids"]) == 1  # a chunk per id, even without a text delta
    (choice,) = last["choices"]
    assert set(choice) == {"index", "delta", "logprobs", "finish_reason", "stop_reason", "token_ids"}
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
    data = await chat(client, messages=user_turn(), return_token_ids=True, return_weight_versions=True)
    n = len(data["choices"][0]["token_ids"])
    assert data["choices"][0]["weight_versions"] == [{"version": "0", "start": 0, "end": n}]
    response = await client.post("/tokentrail/admin/weight-version", json={"version": 7})
    assert response.json() == {"weight_version": 7}
    assert (await client.get("/tokentrail/admin/weight-version")).json() == {"weight_version": 7}
    chunks = await chat_stream(client, messages=user_turn(), return_token_ids=True, return_weight_versions=True)
    n = sum(len(c["choices"][0]["token_ids"]) for c in chunks[1:])
    assert chunks[-1]["choices"][0]["weight_versions"] == [{"version": "7", "start": 0, "end": n}]
    assert all("weight_versions" not in c["choices"][0] for c in chunks[:-1])
    bad = await client.post("/tokentrail/admin/weight-version", json={"version": -1})
    assert bad.status_code == 400


async def test_scoring_route_reproduces_generated_logprobs(client):
    for version in (0, 3):
        await client.post("/tokentrail/admin/weight-version", json={"version": version})
        data = await chat(client, messages=user_turn(), tools=TOOLS, return_token_ids=True, logprobs=True)
        prompt, ids = data["prompt_token_ids"], data["choices"][0]["token_ids"]
        logprobs = [e["logprob"] for e in data["choices"][0]["logprobs"]["content"]]
        await client.post("/tokentrail/admin/weight-version", json={"version": 99})
        scored = await client.post("/tokentrail/score", json={
            "token_ids": prompt + ids, "start": len(prompt), "weight_version": version})
        assert scored.json() == {"logprobs": logprobs, "weight_version": version}
        current = await client.post("/tokentrail/score", json={"token_ids": prompt + ids, "start": len(prompt)})
        assert current.json()["weight_version"] == 99 and current.json()["logprobs"] != logprobs


@pytest.mark.parametrize("body,param", [
    ({"token_ids": [1, -5]}, "token_ids"), ({"token_ids": [1, 2], "start": 3}, "start"),
    ({"token_ids": [1], "weight_version": "x"}, "weight_version"), ({"token_ids": "no"}, "token_ids"),
])
async def test_scoring_route_validates(client, body, param):
    response = await client.post("/tokentrail/score", json=body)
    assert response.status_code == 400 and response.json()["error"]["param"] == param


async def test_n_greater_than_one_is_rejected(client):
    response = await client.post("/v1/chat/completions", json={"messages": user_turn(), "n": 2})
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "BadRequestError" and error["code"] == 400 and error["param"] == "n"


@pytest.mark.parametrize("body,param", [
    ({"top_logprobs": 2}, "top_logprobs"), ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"stream_options": {"include_usage": True}}, "stream_options"), ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 10**6}, "max_tokens"), ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [BASH], "tool_choice": {"type": "function", "function": {"name": "Nope"}}}, "tool_choice"),
    ({"temperature": "hot"}, "temperature"), ({"messages": "hi"}, "messages"),
    ({"messages": [{"content": "no role"}]}, "messages"), ({"tools": [{"type": "function"}]}, "tools"),
])
async def test_invalid_requests_get_vllm_errors(client, body, param):
    response = await client.post("/v1/chat/completions", json={"messages": user_turn(), **body})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


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
    response = await client.post("/v1/chat/completions", content=b"{not json")
    assert response.status_code == 400 and response.json()["error"]["type"] == "BadRequestError"


async def test_model_names(make_client):
    lenient = make_client()
    assert (await chat(lenient, model="gpt-4o", messages=user_turn()))["model"] == "tokentrail-policy"
    strict = make_client(strict_model=True, served_model_name="policy-a")
    response = await strict.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": user_turn()})
    assert response.status_code == 404
    assert response.json() == {"error": {"message": "The model `gpt-4o` does not exist.",
                                         "type": "NotFoundError", "param": "model", "code": 404}}
    assert (await chat(strict, model="policy-a", messages=user_turn()))["model"] == "policy-a"


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
