"""Real clients against the reference policy server: the OpenAI SDK and the CLI."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys

import httpx
import openai
import pydantic
import pytest

from compose.engines.policy import PolicySettings, create_app
from compose.engines.policy import cli as policy_cli
from compose.engines.policy.testkit import TOOLS, user_turn
from compose.engines.policy.tokenizer import IM_END

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))


@pytest.mark.parametrize("stream", [False, True])
async def test_openai_sdk_three_turn_tool_conversation(stream):
    app = create_app(PolicySettings())
    http_client = httpx.AsyncClient(transport=httpx.ASGITransport(app))
    client = openai.AsyncOpenAI(base_url="http://policy/v1", api_key="unused", http_client=http_client)
    scorer = httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://policy")
    messages: list[dict] = user_turn("Check the files, then summarise.")
    previous: list[int] | None = None
    finishes = []
    try:
        for turn in range(3):
            kwargs = dict(model="tokentrail-policy", messages=messages, tools=TOOLS, seed=turn,
                          logprobs=True, extra_body={"return_token_ids": True})
            if stream:
                chunks = [c async for c in await client.chat.completions.create(stream=True, **kwargs)]
                prompt = chunks[0].model_extra["prompt_token_ids"]
                generated = [i for c in chunks for ch in c.choices for i in (ch.model_extra.get("token_ids") or [])]
                logprobs = [e.logprob for c in chunks for ch in c.choices if ch.logprobs
                            for e in ch.logprobs.content]
                finish = chunks[-1].choices[0].finish_reason
                content = "".join(ch.delta.content or "" for c in chunks for ch in c.choices) or None
                calls: dict[int, dict] = {}
                for c in chunks:
                    for ch in c.choices:
                        for tc in ch.delta.tool_calls or ():
                            slot = calls.setdefault(tc.index, {"id": tc.id, "name": "", "arguments": ""})
                            slot["name"] += tc.function.name or ""
                            slot["arguments"] += tc.function.arguments or ""
                tool_calls = [{"id": v["id"], "type": "function",
                               "function": {"name": v["name"], "arguments": v["arguments"]}}
                              for v in calls.values()]
            else:
                response = await client.chat.completions.create(**kwargs)
                prompt = response.model_extra["prompt_token_ids"]
                choice = response.choices[0]
                generated = choice.model_extra["token_ids"]
                logprobs = [e.logprob for e in choice.logprobs.content]
                finish = choice.finish_reason
                content = choice.message.content
                tool_calls = [tc.model_dump() for tc in choice.message.tool_calls or ()]
            finishes.append(finish)
            assert generated[-1] == IM_END
            if previous is not None:  # the prompt extends the last call, token for token
                assert prompt[: len(previous)] == previous
            scored = await scorer.post("/tokentrail/score", json={"token_ids": prompt + generated,
                                                                   "start": len(prompt)})
            assert scored.json()["logprobs"] == logprobs
            previous = prompt + generated
            assistant: dict = {"role": "assistant", "content": content}
            if tool_calls:
                assistant["tool_calls"] = tool_calls
            messages = messages + [assistant] + [
                {"role": "tool", "tool_call_id": tc["id"], "content": f"tokentrail-{i + 1}\n"}
                for i, tc in enumerate(tool_calls)]
        assert finishes == ["tool_calls", "tool_calls", "stop"]
        assert content and content.endswith(".")
    finally:
        await client.close()
        await scorer.aclose()


def test_cli_settings_are_validated():
    parser = argparse.ArgumentParser()
    policy_cli.configure(parser)
    args = parser.parse_args(["--max-model-len", "3"])
    assert policy_cli.main(args) == 2
    args = parser.parse_args(["--fault", "stall", "--stall-seconds", "2", "--reasoning", "--port", "0"])
    settings = policy_cli.settings_from_args(args)
    assert settings.faults == frozenset({"stall"}) and settings.reasoning and settings.port == 0
    with pytest.raises(pydantic.ValidationError, match="unknown_option"):
        PolicySettings(unknown_option=True)


def test_tokentrail_policy_command_serves_on_a_free_port():
    proc = subprocess.Popen(
        [sys.executable, "-m", "compose.cli", "policy", "--port", "0", "--served-model-name", "cli-policy"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("policy listening on http://127.0.0.1:"), (line, proc.stderr.read() if proc.poll() is not None else "")
        url = line.removeprefix("policy listening on ")
        with httpx.Client(base_url=url, timeout=10) as client:
            assert client.get("/health").status_code == 200
            data = client.post("/v1/chat/completions", json={"messages": user_turn()}).json()
            assert data["model"] == "cli-policy"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def test_the_policy_socket_serves_with_tcp_nodelay():
    # Without it, each response waits out the client's delayed ACK (~40 ms): a slow "engine".
    sock = policy_cli.bind_socket("127.0.0.1", 0)
    seen: list[int] = []

    class Probe(asyncio.Protocol):
        def connection_made(self, transport):
            seen.append(transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            transport.close()

    server = await asyncio.get_running_loop().create_server(Probe, sock=sock)
    try:
        _, writer = await asyncio.open_connection(*sock.getsockname()[:2])
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.01)
        writer.close()
    finally:
        server.close()
    assert seen and seen[0] != 0


def test_middleware_is_applied_as_vllm_does_and_a_bad_path_stops_startup():
    from producers.middleware import TokentrailMiddleware

    assert policy_cli._import_class("producers.middleware.TokentrailMiddleware") is TokentrailMiddleware
    assert policy_cli._import_class("producers.middleware:TokentrailMiddleware") is TokentrailMiddleware
    parser = argparse.ArgumentParser()
    policy_cli.configure(parser)
    assert policy_cli.main(parser.parse_args(["--middleware", "no_such_module.Middleware"])) == 2
    assert policy_cli.main(parser.parse_args(["--middleware", "NoDots"])) == 2


def test_middleware_wraps_the_inner_chain_like_vllm_add_middleware(monkeypatch):
    from producers.middleware import TokentrailMiddleware

    monkeypatch.setenv("TOKENTRAIL_BOOTSTRAP", "127.0.0.1:9")
    app = policy_cli.build_app(PolicySettings(), ["producers.middleware.TokentrailMiddleware"])
    layer = app.middleware_stack
    while not isinstance(layer, TokentrailMiddleware):
        layer = layer.app
    assert layer.config_error is None and layer.app is not app  # the inner chain, not the Starlette app
    assert app.user_middleware[0].cls is TokentrailMiddleware


def test_a_middleware_without_its_settings_stops_startup(monkeypatch, capsys):
    monkeypatch.delenv("TOKENTRAIL_BOOTSTRAP", raising=False)
    parser = argparse.ArgumentParser()
    policy_cli.configure(parser)
    assert policy_cli.main(parser.parse_args(["--middleware", "producers.middleware.TokentrailMiddleware",
                                              "--port", "0"])) == 2
    assert "TOKENTRAIL_BOOTSTRAP" in capsys.readouterr().err


def test_old_flags_still_parse():
    parser = argparse.ArgumentParser()
    policy_cli.configure(parser)
    args = parser.parse_args(["--strict-model", "--honour-prefix", "--weight-version", "3"])
    settings = policy_cli.settings_from_args(args)
    assert settings.strict_model and settings.weight_version == "3"
    lenient = policy_cli.settings_from_args(parser.parse_args(["--lenient-model", "--no-dev-mode"]))
    assert not lenient.strict_model and not lenient.dev_mode
