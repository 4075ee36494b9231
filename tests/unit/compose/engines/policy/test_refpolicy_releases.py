"""Where vLLM 0.34 and 0.33 answer differently, the stand-in follows the release it is set to (``vllm_release``):
nulls 0.34 leaves out, ``tools: []``, the named-tool error text, and 0.34's checkpoint routes (sleep mode)."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from compose.engines.policy import PolicySettings
from compose.engines.policy.testkit import BASH, chat, chat_stream, user_turn

LONG = dict(messages=user_turn(), max_tokens=60, ignore_eos=True, return_token_ids=True, logprobs=True, seed=1)


async def test_0_33_sends_null_annotations_and_prompt_tokens_details_which_0_34_leaves_out(make_client):
    old = await chat(make_client(vllm_release="0.33"), messages=user_turn())
    new = await chat(make_client(vllm_release="0.34"), messages=user_turn())
    assert old["choices"][0]["message"]["annotations"] is None and old["usage"]["prompt_tokens_details"] is None
    assert "annotations" not in new["choices"][0]["message"] and "prompt_tokens_details" not in new["usage"]
    assert old["system_fingerprint"].startswith("vllm-0.33.0-") and new["system_fingerprint"].startswith("vllm-0.34.0-")
    assert (await make_client(vllm_release="0.33").get("/version")).json() == {"version": "0.33.0"}


async def test_empty_tools_are_refused_by_0_33_and_read_as_no_tools_by_0_34(make_client):
    refused = await make_client(vllm_release="0.33").post(
        "/v1/chat/completions", json={"messages": user_turn(), "tools": []})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "tools"
    client = make_client()
    for choice in ("auto", "required", None):
        body = {"tools": [], **({"tool_choice": choice} if choice else {})}
        data = await chat(client, messages=user_turn(), return_token_ids=True, **body)
        assert data["choices"][0]["finish_reason"] in ("stop", "length")
        assert "tool_calls" not in data["choices"][0]["message"]
    named = {"type": "function", "function": {"name": "Nope"}}
    answer = await client.post("/v1/chat/completions", json={"messages": user_turn(), "tools": [], "tool_choice": named})
    assert answer.status_code == 400  # a named choice keeps the empty list, and names no tool of it


@pytest.mark.parametrize("release,text", [
    ("0.33", "The tool specified in `tool_choice` does not match any of the specified `tools`"),
    ("0.34", "The tool `Nope` specified in `tool_choice` does not match any of the specified `tools`"),
])
async def test_the_named_tool_error_names_the_tool_from_0_34(make_client, release, text):
    answer = await make_client(vllm_release=release).post("/v1/chat/completions", json={
        "messages": user_turn(), "tools": [BASH], "tool_choice": {"type": "function", "function": {"name": "Nope"}}})
    assert answer.status_code == 400 and answer.json()["error"]["message"] == f"{text} (parameter=tool_choice)"


def test_sleep_mode_is_0_34_only():
    with pytest.raises(ValidationError, match="new in vLLM 0.34"):
        PolicySettings(vllm_release="0.33", sleep_mode=True)


async def test_checkpoint_routes_are_served_only_in_sleep_mode(make_client):
    assert (await make_client().post("/checkpoint/prepare")).status_code == 404
    client = make_client(sleep_mode=True)
    status = await client.get("/checkpoint/status")
    assert (status.status_code, status.json()) == (503, {"state": "running"})
    bad = await client.post("/checkpoint/prepare", params={"mode": "sometimes"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "query.mode"


async def test_checkpoint_prepare_abort_ends_a_stream_in_flight_with_abort_and_restore_resumes(make_client):
    client = make_client(sleep_mode=True, decode_ms_per_token=10)
    await chat(client, messages=user_turn(), max_tokens=1)  # warm
    task = asyncio.ensure_future(chat_stream(client, **LONG, stream_options={"include_usage": True}))
    await asyncio.sleep(0.15)
    prepared = await client.post("/checkpoint/prepare", params={"mode": "abort"})
    assert (prepared.status_code, prepared.json()) == (200, {"state": "prepared"})
    chunks = await asyncio.wait_for(task, 5)
    terminal = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert [c["choices"][0]["finish_reason"] for c in terminal] == ["abort"]
    assert (await client.get("/checkpoint/status")).status_code == 200
    assert (await client.post("/checkpoint/prepare")).json() == {"state": "prepared"}  # repeating: a no-op
    waiting = asyncio.ensure_future(chat(client, **{**LONG, "max_tokens": 5}))
    await asyncio.sleep(0.1)
    assert not waiting.done()  # new requests wait while the engine is not running
    assert (await client.post("/checkpoint/restore")).json() == {"state": "running"}
    after = await asyncio.wait_for(waiting, 5)
    assert after["choices"][0]["finish_reason"] == "length"
    assert (await client.get("/checkpoint/status")).status_code == 503


async def test_checkpoint_prepare_waits_by_default_for_generations_to_finish(make_client):
    client = make_client(sleep_mode=True, decode_ms_per_token=10)
    await chat(client, messages=user_turn(), max_tokens=1)
    task = asyncio.ensure_future(chat(client, **{**LONG, "max_tokens": 30}))
    await asyncio.sleep(0.1)
    started = await client.post("/checkpoint/prepare")
    assert started.json() == {"state": "preparing"}
    assert (await client.post("/checkpoint/restore")).status_code == 400  # not while draining
    data = await asyncio.wait_for(task, 5)
    assert data["choices"][0]["finish_reason"] == "length"  # drained, not aborted
    for _ in range(50):
        if (await client.get("/checkpoint/status")).status_code == 200:
            break
        await asyncio.sleep(0.02)
    assert (await client.get("/checkpoint/status")).json() == {"state": "prepared"}
