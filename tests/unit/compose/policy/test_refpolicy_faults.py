"""Injected faults and prefix supply of the reference policy server."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import httpx
import pytest
import uvicorn

from compose.policy import PolicySettings, create_app
from compose.policy import template
from compose.policy.server import StalledStreamAborted
from compose.policy.testkit import BASH, TOOLS, chat, chat_stream, echo, parse_sse, tool_results, user_turn
from compose.policy.tokenizer import get_tokenizer

TOK = get_tokenizer()


def marked(fault: str) -> list[dict]:
    return user_turn(f"List the files. [[fault:{fault}]]")


@pytest.mark.parametrize("stream", [False, True])
async def test_5xx_marker_and_setting(make_client, stream):
    for client, messages in ((make_client(), marked("5xx")), (make_client(faults={"5xx"}), user_turn())):
        response = await client.post("/v1/chat/completions", json={"messages": messages, "stream": stream})
        assert response.status_code == 500
        assert response.json()["error"]["type"] == "InternalServerError"
        assert response.json()["error"]["code"] == 500
    # the marker only counts in the last message
    client = make_client()
    earlier = marked("5xx") + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "again"}]
    assert (await client.post("/v1/chat/completions", json={"messages": earlier})).status_code == 200


async def test_no_token_ids_marker(client):
    data = await chat(client, messages=marked("no_token_ids"), return_token_ids=True, logprobs=True)
    assert data["prompt_token_ids"] is None and data["choices"][0]["token_ids"] is None
    assert data["choices"][0]["logprobs"] is not None  # only the ids go missing
    chunks = await chat_stream(client, messages=marked("no_token_ids"), return_token_ids=True)
    assert chunks[0]["prompt_token_ids"] is None
    assert all(c["choices"][0]["token_ids"] is None for c in chunks[1:])


async def test_no_token_ids_setting(make_client):
    client = make_client(faults={"no_token_ids"})
    data = await chat(client, messages=user_turn(), return_token_ids=True)
    assert data["prompt_token_ids"] is None and data["choices"][0]["token_ids"] is None


@pytest.mark.parametrize("where", ["marker", "setting"])
async def test_drift_breaks_retokenization_of_the_echo(make_client, where):
    client = make_client(faults={"drift"}) if where == "setting" else make_client()
    messages = marked("drift") if where == "marker" else user_turn()
    data = await chat(client, messages=messages, return_token_ids=True, logprobs=True)
    prompt, ids = data["prompt_token_ids"], data["choices"][0]["token_ids"]
    assert TOK.encode(TOK.decode(ids)) != ids
    nxt = await chat(client, messages=messages + [echo(data["choices"][0]["message"]),
                                                  {"role": "user", "content": "and?"}],
                     return_token_ids=True)
    assert nxt["prompt_token_ids"][: len(prompt) + len(ids)] != prompt + ids
    scored = await client.post("/tokentrail/score", json={"token_ids": prompt + ids, "start": len(prompt)})
    assert scored.json()["logprobs"] == [e["logprob"] for e in data["choices"][0]["logprobs"]["content"]]


async def test_stall_with_timeout_aborts_in_process():
    app = create_app(PolicySettings(stall_seconds=0.01, stall_after_chunks=2))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://p") as client:
        with pytest.raises(StalledStreamAborted):
            await client.post("/v1/chat/completions", json={"messages": marked("stall"), "stream": True,
                                                            "return_token_ids": True})
        # non-streaming requests ignore the stall fault
        assert (await client.post("/v1/chat/completions", json={"messages": marked("stall")})).status_code == 200


@contextlib.asynccontextmanager
async def served(settings: PolicySettings):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(create_app(settings), log_level="critical", lifespan="off",
                            timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    for _ in range(500):
        if server.started:
            break
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task


async def read_events(response: httpx.Response, into: list[str]) -> None:
    buffer = ""
    async for text in response.aiter_text():
        buffer += text
        while "\n\n" in buffer:
            event, buffer = buffer.split("\n\n", 1)
            into.append(event)


@pytest.mark.parametrize("stall_seconds", [None, 0.05], ids=["hang", "abort"])
async def test_stalled_stream_over_http(stall_seconds):
    settings = PolicySettings(stall_seconds=stall_seconds, stall_after_chunks=3)
    async with served(settings) as url:
        events: list[str] = []
        timeout = httpx.Timeout(5.0, read=0.5)
        async with httpx.AsyncClient(base_url=url, timeout=timeout) as client:
            body = {"messages": marked("stall"), "stream": True, "return_token_ids": True, "tools": [BASH]}
            expected = httpx.ReadTimeout if stall_seconds is None else httpx.RemoteProtocolError
            with pytest.raises(expected):
                async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                    assert response.status_code == 200
                    await read_events(response, events)
            assert len(events) == 4 and "[DONE]" not in "".join(events)  # first + 3 chunks
            # the server is still healthy afterwards
            assert (await client.get("/health")).status_code == 200
            ok = await client.post("/v1/chat/completions", json={**body, "messages": user_turn()})
            assert parse_sse(ok.text)[-1]["choices"][0]["finish_reason"] == "tool_calls"


# -- prefix supply ----------------------------------------------------------------

async def first_turn(client, **body):
    data = await chat(client, messages=user_turn(), tools=TOOLS, return_token_ids=True, **body)
    message = data["choices"][0]["message"]
    history = user_turn() + [echo(message)] + tool_results(message)
    return data, history


async def test_prefix_supply_is_honoured(make_client):
    # a template that re-renders history differently proves the prefix, not the render, is used
    client = make_client(honour_prefix=True, reasoning=True, drop_reasoning_in_history=True)
    data, history = await first_turn(client)
    prefix = data["prompt_token_ids"] + data["choices"][0]["token_ids"]
    nxt = await chat(client, messages=history, tools=TOOLS, return_token_ids=True,
                     required_prefix_token_ids=prefix)
    suffix = TOK.encode(template.render_continuation(history[3:]))
    assert nxt["prompt_token_ids"] == prefix + suffix
    plain = await chat(client, messages=history, tools=TOOLS, return_token_ids=True)
    assert plain["prompt_token_ids"][: len(prefix)] != prefix
    # whatever prefix is supplied is what the model generates from, and says so
    odd = await chat(client, messages=history, tools=TOOLS, return_token_ids=True, logprobs=True,
                     required_prefix_token_ids=[1, 42, 2])
    assert odd["prompt_token_ids"] == [1, 42, 2] + suffix
    ids = odd["prompt_token_ids"] + odd["choices"][0]["token_ids"]
    scored = await client.post("/tokentrail/score", json={"token_ids": ids, "start": len(odd["prompt_token_ids"])})
    assert scored.json()["logprobs"] == [e["logprob"] for e in odd["choices"][0]["logprobs"]["content"]]


async def test_prefix_supply_is_ignored_when_off(client):
    data, history = await first_turn(client)
    with_field = await chat(client, messages=history, tools=TOOLS, return_token_ids=True,
                            required_prefix_token_ids=[1, 42, 2])
    without = await chat(client, messages=history, tools=TOOLS, return_token_ids=True)
    assert with_field["prompt_token_ids"] == without["prompt_token_ids"]


@pytest.mark.parametrize("prefix,messages", [
    ([1, 2], user_turn()),  # no assistant message to hang the prefix on
    ([1, -3], user_turn() + [{"role": "assistant", "content": "x"}]),
    ("ids", user_turn() + [{"role": "assistant", "content": "x"}]),
])
async def test_prefix_supply_rejects_what_it_cannot_honour(make_client, prefix, messages):
    client = make_client(honour_prefix=True)
    response = await client.post("/v1/chat/completions", json={
        "messages": messages, "required_prefix_token_ids": prefix})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "required_prefix_token_ids"
