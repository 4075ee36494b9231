"""Injected faults and prefix supply of the reference policy server."""

from __future__ import annotations

import contextlib

import httpx
import pytest

from compose.engines.policy import PolicySettings, create_app, template
from compose.engines.policy.server import StalledStreamAborted
from compose.engines.policy.testkit import BASH, TOOLS, chat, chat_stream, echo, parse_sse, tool_results, user_turn
from compose.engines.policy.tokenizer import get_tokenizer
from tests.unit.compose.asgi_server import serve

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
    async with serve(create_app(settings)) as url:
        yield url


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


# -- prompt ids in: kv_transfer_params.prompt_token_ids (vLLM's, replacing required_prefix_token_ids) --

async def first_turn(client, **body):
    data = await chat(client, messages=user_turn(), tools=TOOLS, return_token_ids=True, **body)
    message = data["choices"][0]["message"]
    history = user_turn() + [echo(message)] + tool_results(message)
    return data, history


@pytest.mark.parametrize("stream", [False, True])
async def test_supplied_prompt_ids_replace_the_rendering(make_client, stream):
    # a template that re-renders history differently proves the ids, not the render, are used
    client = make_client(reasoning=True, drop_reasoning_in_history=True)
    data, history = await first_turn(client)
    prefix = data["prompt_token_ids"] + data["choices"][0]["token_ids"]
    ids = prefix + TOK.encode(template.render_continuation(history[3:]))
    body = dict(messages=history, tools=TOOLS, return_token_ids=True, logprobs=True, return_prompt_text=True,
                kv_transfer_params={"prompt_token_ids": ids})
    if stream:
        chunks = await chat_stream(client, **body)
        prompt, prompt_text = chunks[0]["prompt_token_ids"], chunks[0]["prompt_text"]
        generated = [i for c in chunks[1:] for i in c["choices"][0]["token_ids"] or []]
        logprobs = [e["logprob"] for c in chunks[1:] for e in (c["choices"][0]["logprobs"] or {}).get("content", [])]
        assert any(c["choices"][0]["delta"].get("tool_calls") for c in chunks[1:])  # the tool parser still runs
    else:
        nxt = await chat(client, **body)
        prompt, prompt_text = nxt["prompt_token_ids"], nxt["prompt_text"]
        generated = nxt["choices"][0]["token_ids"]
        logprobs = [e["logprob"] for e in nxt["choices"][0]["logprobs"]["content"]]
        assert nxt["choices"][0]["message"]["tool_calls"]
    assert prompt == ids and prompt_text is None  # tokens in: no rendered text
    plain = await chat(client, messages=history, tools=TOOLS, return_token_ids=True)
    assert plain["prompt_token_ids"][: len(prefix)] != prefix
    scored = await client.post("/tokentrail/score", json={"token_ids": ids + generated, "start": len(ids)})
    assert scored.json()["logprobs"] == logprobs


async def test_required_prefix_token_ids_is_ignored_as_vllm_ignores_it(make_client):
    for client in (make_client(), make_client(honour_prefix=True)):  # the old flag is an accepted no-op
        data, history = await first_turn(client)
        with_field = await chat(client, messages=history, tools=TOOLS, return_token_ids=True,
                                required_prefix_token_ids=[1, 42, 2])
        without = await chat(client, messages=history, tools=TOOLS, return_token_ids=True)
        assert with_field["prompt_token_ids"] == without["prompt_token_ids"]


@pytest.mark.parametrize("ids,message", [
    ([], "`kv_transfer_params['prompt_token_ids']` must be a non-empty list of non-negative integers."),
    ([1, -3], "`kv_transfer_params['prompt_token_ids']` must be a non-empty list of non-negative integers."),
    ("ids", "`kv_transfer_params['prompt_token_ids']` must be a non-empty list of non-negative integers."),
    ([1, True], "`kv_transfer_params['prompt_token_ids']` must be a non-empty list of non-negative integers."),
    ([1, 10**6], "Token id 1000000 is out of vocabulary"),
])
async def test_supplied_prompt_ids_are_validated_like_vllm(client, ids, message):
    response = await client.post("/v1/chat/completions", json={
        "messages": user_turn(), "kv_transfer_params": {"prompt_token_ids": ids}})
    assert response.status_code == 400
    assert response.json()["error"] == {"message": f"{message} (parameter=kv_transfer_params.prompt_token_ids)",
                                        "type": "BadRequestError", "param": "kv_transfer_params.prompt_token_ids",
                                        "code": 400}


async def test_supplied_prompt_ids_are_ignored_with_echo_or_media(client):
    rendered = (await chat(client, messages=user_turn(), return_token_ids=True))["prompt_token_ids"]
    echoed = await chat(client, messages=user_turn(), echo=True, return_token_ids=True,
                        kv_transfer_params={"prompt_token_ids": [1, 2, 3]})
    assert echoed["prompt_token_ids"] == rendered
    media = [{"role": "user", "content": [{"type": "text", "text": "look"},
                                          {"type": "image_url", "image_url": {"url": "data:,"}}]}]
    pictured = await chat(client, messages=media, return_token_ids=True, kv_transfer_params={"prompt_token_ids": [1]})
    assert pictured["prompt_token_ids"] != [1]


async def test_supplied_prompt_ids_longer_than_the_context_are_refused(make_client):
    client = make_client(max_model_len=64)
    response = await client.post("/v1/chat/completions", json={
        "messages": user_turn(), "kv_transfer_params": {"prompt_token_ids": [5] * 70}})
    assert response.status_code == 400
    assert response.json()["error"] == {"message": "Input length (70) exceeds model's maximum context length (64).",
                                        "type": "BadRequestError", "param": None, "code": 400}
