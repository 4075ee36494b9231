"""The stand-in's ``POST /inference/v1/generate`` (stream, output_mode derender) against vLLM 0.34's contract.

Proves: each chunk is a ``GenerateDerenderStreamResponse`` as 0.34 serialises it (every choice field
present, checked against the checked-in 0.34 description), the usage chunk is its ``exclude_none``
form; the role comes once, the prompt ids once, the weight-version spans on the terminal chunk; the
ids and log-probs equal, bit for bit, what the chat route generates from the same ids as
``kv_transfer_params.prompt_token_ids``; 0.33 mode refuses stream with derender as 0.33 did; a
request the stand-in cannot plan (no render of its own) is refused naming the field.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from compose.engines.policy import create_app
from compose.engines.vllm_contract import load
from compose.engines.vllm_contract.check import Contract

CONTRACT = Contract(load())
CHOICE_FIELDS = set(load()["classes"]["GenerateDerenderStreamChoice"]["fields"])
TOOL = {"type": "function", "function": {"name": "Bash", "description": "Run a shell command", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
CHAT = {"messages": [{"role": "system", "content": "#tool-calls=1"}, {"role": "user", "content": "list files"}],
        "tools": [TOOL], "stream": True, "logprobs": True, "top_logprobs": 0, "return_token_ids": True,
        "include_reasoning": True, "return_weight_versions": True, "max_tokens": 60,
        "stream_options": {"include_usage": True}}


def _events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


async def _generate(release: str = "0.34", chat: dict | None = None, **change: Any) -> tuple[httpx.Response, dict, Any]:
    app = create_app(vllm_release=release)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as client:
        rendered = (await client.post("/v1/chat/completions/render", json=chat or CHAT)).json()
        request = {**rendered, "output_mode": "derender", "stream": True, "return_token_ids": True, **change}
        r = await client.post("/inference/v1/generate", json=request)
        same_ids = {**(chat or CHAT), "kv_transfer_params": {"prompt_token_ids": request["token_ids"]}}
        chat_r = await client.post("/v1/chat/completions", json=same_ids)
    return r, request, _events(chat_r.text)


@pytest.mark.parametrize("chat", [CHAT, {**CHAT, "messages": [{"role": "user", "content": "say hi"}], "tools": None}])
async def test_the_derender_stream_fits_0_34_and_carries_the_chat_routes_exact_tokens(chat):
    r, request, chat_chunks = await _generate(chat=chat)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert r.text.rstrip().endswith("data: [DONE]")
    chunks = _events(r.text)
    *steps, usage = chunks
    for chunk in steps:
        assert CONTRACT.problems(chunk, "GenerateDerenderStreamResponse", "chunk") == [], chunk
        assert set(chunk["choices"][0]) == CHOICE_FIELDS and chunk["output_mode"] == "derender"
        assert chunk["request_id"] == f"generate-tokens-{request['request_id']}"
    assert CONTRACT.problems(usage, "GenerateDerenderStreamResponse", "exclude_none") == [] and usage["choices"] == []
    assert [c["choices"][0]["delta"]["role"] for c in steps] == ["assistant"] + [None] * (len(steps) - 1)
    assert ["prompt_token_ids" in c for c in steps] == [True] + [False] * (len(steps) - 1)
    assert steps[0]["prompt_token_ids"] == request["token_ids"]
    assert [c["choices"][0]["weight_versions"] is not None for c in steps] == [False] * (len(steps) - 1) + [True]
    assert steps[-1]["choices"][0]["finish_reason"] in ("stop", "tool_calls")
    # The same ids on the chat route (kv_transfer_params): the same generation, bit for bit.
    ids = [t for c in steps for t in c["choices"][0]["token_ids"]]
    logprobs = [e for c in steps for e in c["choices"][0]["logprobs"]["content"]]
    chat_ids = [t for c in chat_chunks for ch in c["choices"] for t in ch.get("token_ids") or ()]
    chat_logprobs = [e for c in chat_chunks for ch in c["choices"] for e in (ch.get("logprobs") or {}).get("content") or ()]
    assert ids == chat_ids and len(ids) > 3
    assert [e["logprob"].hex() for e in logprobs] == [e["logprob"].hex() for e in chat_logprobs]
    text = "".join(c["choices"][0]["delta"]["content"] or "" for c in steps)
    chat_text = "".join(ch["delta"].get("content") or "" for c in chat_chunks for ch in c["choices"])
    assert text == chat_text
    if chat.get("tools"):
        calls = [d for c in steps for d in c["choices"][0]["delta"].get("tool_calls", ())]
        assert calls and calls[0]["function"]["name"] == "Bash" and set(calls[0]) == {"id", "type", "index", "function"}


async def test_0_33_refuses_stream_with_derender_as_0_33_did():
    r, _, _ = await _generate("0.33")
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "stream" and "derender" in error["message"] and "0.34" in error["message"]


@pytest.mark.parametrize("change,param", [({"request_id": "chatcmpl-unknown"}, "request_id"),
                                          ({"output_mode": "tokens"}, "output_mode"),
                                          ({"stream": False}, "output_mode"),
                                          ({"output_mode": "nope"}, "output_mode")])
async def test_what_the_stand_in_does_not_model_is_refused_naming_the_field(change, param):
    r, _, _ = await _generate(**change)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


async def test_the_no_token_ids_fault_sends_chunks_without_ids():
    chat = {**CHAT, "messages": [{"role": "user", "content": "hi [[fault:no_token_ids]]"}], "tools": None}
    r, _, _ = await _generate(chat=chat)
    steps = _events(r.text)[:-1]
    assert steps and all(c["choices"][0]["token_ids"] is None for c in steps)
