"""The capture's own CPU per call, in process: an 8k-prompt / 512-token call, JSON and streamed.

The interceptor (``producers.http.app.Interceptor``) runs in this process in front of an
in-memory engine (``httpx.MockTransport`` answering pre-encoded vLLM-shaped bytes: prompt ids,
token ids, one ``logprobs.content`` entry per token with its ``bytes``) and an acked producer that
acknowledges at once; calls are driven through its raw ASGI interface. So the figure is the
capture's CPU alone, from the request's bytes to the answer's: no sockets, no HTTP server, no
broker, no engine. It is a floor of the deployed figure (``bench interceptor`` and ``bench e2e``
add uvicorn's HTTP, httpx's sockets and librdkafka), and deterministic enough to compare changes:
each figure is the best of ``--rounds`` rounds (CPU time, ``time.process_time``), and the same run
prints the in-memory engine's own cost (a call made straight to it) as the baseline. Once the
interceptor has started and warmed, the bench freezes the collector's startup heap, as both
deployments do (the proxy's lifespan: ``producers.call.large_bodies.freeze_startup_heap``; vLLM's
API server freezes its own after start-up): otherwise every ~100 calls a full collection walks
every module object, which no deployed interceptor does.

Budget (docs/ARCHITECTURE.md §8): the interceptor at most 1.5 ms of CPU per 8k/512 call, proxy and
middleware alike; this bench prints the in-process share of it. ``--profile`` prints the top frames
(cProfile, by own time) of the JSON and the streamed call.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import pstats
import time
from typing import Any

from compose.tools.bench.budgets import budget_line

BUDGET_CPU_MS = 1.5


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt-tokens", type=int, default=8192)
    parser.add_argument("--gen-tokens", type=int, default=512)
    parser.add_argument("--calls", type=int, default=200, help="calls per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per mode (the best is reported)")
    parser.add_argument("--profile", action="store_true", help="print the top 20 frames of each mode")
    parser.add_argument("--dialect", choices=[*sorted(_DIALECTS), "all"], default="chat",
                        help="the harness's API (chat: OpenAI chat; anthropic: Claude Code's; responses: Codex's)")


def _request(dialect: str, words: str, gen: int, stream: bool) -> tuple[str, bytes]:
    """(the API path, the harness's request body) of one 8k-prompt call in ``dialect``."""
    if dialect == "anthropic":
        body: dict[str, Any] = {"model": "policy", "max_tokens": gen, "stream": stream,
                                "messages": [{"role": "user", "content": words}]}
    elif dialect == "responses":
        body = {"model": "policy", "max_output_tokens": gen, "stream": stream, "input": words}
    else:
        body = {"model": "policy", "max_tokens": gen, "stream": stream,
                "messages": [{"role": "user", "content": words}]}
    return _DIALECTS[dialect], json.dumps(body).encode()


_DIALECTS = {"chat": "/v1/chat/completions", "anthropic": "/v1/messages", "responses": "/v1/responses"}


def _answer(prompt: int, gen: int, seed: int) -> dict[str, Any]:
    ids = [(seed * 7 + k) % 30000 + 10 for k in range(gen)]
    entries = [{"token": f"w{t}", "logprob": -0.125 * (k % 7 + 1), "bytes": list(f"w{t}".encode()), "top_logprobs": []}
               for k, t in enumerate(ids)]
    message: dict[str, Any] = {"role": "assistant", "content": " ".join(f"w{t}" for t in ids), "reasoning": None,
               "refusal": None,
               "tool_calls": [], "annotations": None, "audio": None, "function_call": None}
    return {"id": "chatcmpl-x", "object": "chat.completion", "created": 0, "model": "policy",
            "choices": [{"index": 0, "message": message, "logprobs": {"content": entries}, "finish_reason": "length",
                         "stop_reason": None, "token_ids": ids}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": gen, "total_tokens": prompt + gen},
            "prompt_logprobs": None, "prompt_token_ids": list(range(100, 100 + prompt)), "kv_transfer_params": None}


def _sse(answer: dict[str, Any]) -> bytes:
    """The answer as vLLM streams it: one chunk per token, the prompt ids on the first, a usage chunk last."""
    choice = answer["choices"][0]
    out = []
    for k, token in enumerate(choice["token_ids"]):
        entry = choice["logprobs"]["content"][k]
        delta = {"role": "assistant", "content": entry["token"]} if k == 0 else {"content": " " + entry["token"]}
        chunk: dict[str, Any] = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 0, "model": "policy",
                                 "choices": [{"index": 0, "delta": delta, "logprobs": {"content": [entry]},
                                              "finish_reason": "length" if k == len(choice["token_ids"]) - 1 else None,
                                              "token_ids": [token]}]}
        if k == 0:
            chunk["prompt_token_ids"] = answer["prompt_token_ids"]
        out.append(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    usage = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 0, "model": "policy", "choices": [],
             "usage": answer["usage"]}
    return b"".join(out) + b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n"


class _Acks:
    """An acked producer that acknowledges at once (the broker's share is not this bench's)."""

    async def produce(self, topic: str, key: bytes | None, value: bytes, headers: Any = None) -> tuple[int, int]:
        return 0, 0

    async def close(self, timeout_s: float | None = None) -> int:
        return 0


def _scope(path: str, body: bytes) -> dict[str, Any]:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "server": ("tt", 80),
            "client": ("127.0.0.1", 5000),
            "headers": [(b"host", b"tt"), (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode())]}


async def _call(app: Any, path: str, body: bytes) -> None:
    sent = False
    status: list[int] = []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])

    await app(_scope(path, body), receive, send)
    if status != [200]:
        raise RuntimeError(f"the capture answered {status}")


async def _measure(args: argparse.Namespace, stream: bool) -> tuple[float, float, str]:
    import httpx

    from producers.call.large_bodies import freeze_startup_heap
    from producers.http.app import Interceptor
    from producers.settings import InterceptorSettings

    answers = [_answer(args.prompt_tokens, args.gen_tokens, seed) for seed in range(4)]
    bodies = [_sse(a) if stream else json.dumps(a).encode() for a in answers]
    kind = "text/event-stream" if stream else "application/json"
    served = [0]

    def engine(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(200, json={"object": "list", "data": [
                {"id": "policy", "object": "model", "max_model_len": 65536}]})
        served[0] += 1
        return httpx.Response(200, content=bodies[served[0] % len(bodies)], headers={"content-type": kind})

    client = httpx.AsyncClient(base_url="http://engine", transport=httpx.MockTransport(engine))
    settings = InterceptorSettings(upstream_url="http://engine", bootstrap="unused:9092", follow_versions=False)
    app = Interceptor(settings, publisher=_Acks(), upstream=client)  # type: ignore[arg-type]
    await app.startup()
    words = " ".join(f"word{i % 977}" for i in range(args.prompt_tokens // 2))
    api, request = _request(args.dialect, words, args.gen_tokens, stream)
    for i in range(20):  # warm: imports, caches, the engine catalog
        await _call(app, f"/ng-rollout/warm{i}/training-token-capture{api}", request)
    freeze_startup_heap()  # as deployed (the module docstring)
    engine_request = _request("chat", words, args.gen_tokens, stream)[1]
    best = base = float("inf")
    for r in range(args.rounds):
        t0 = time.process_time()
        for _ in range(args.calls):
            response = await client.post("/v1/chat/completions", content=engine_request)
            await response.aread()
        base = min(base, (time.process_time() - t0) / args.calls)
        t0 = time.process_time()
        for i in range(args.calls):
            await _call(app, f"/ng-rollout/r{r}x{i}/training-token-capture{api}", request)
        best = min(best, (time.process_time() - t0) / args.calls)
    profile = ""
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        for i in range(args.calls):
            await _call(app, f"/ng-rollout/p{i}/training-token-capture{api}", request)
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(20)
        profile = out.getvalue()
    await app.shutdown()
    await client.aclose()
    return best, base, profile


def main(args: argparse.Namespace) -> int:
    dialects = sorted(_DIALECTS) if args.dialect == "all" else [args.dialect]
    print(f"capture CPU per call, in process: {args.prompt_tokens}-token prompt, {args.gen_tokens} generated tokens, "
          f"best of {args.rounds} rounds of {args.calls} calls (no sockets, no broker: a floor of the deployed figure)")
    results = {}
    for dialect in dialects:
        for stream in (False, True):
            mode = "streamed" if stream else "json"
            best, base, profile = asyncio.run(_measure(argparse.Namespace(**{**vars(args), "dialect": dialect}),
                                                       stream))
            results[(dialect, mode)] = best - base
            print(f"  {dialect:<9} {mode:<9} {best * 1000:7.3f} ms per call; the in-memory engine alone "
                  f"{base * 1000:6.3f} ms; the capture's own {(best - base) * 1000:7.3f} ms")
            if profile:
                print(profile)
    for (dialect, mode), value in results.items():
        name = "" if dialect == "chat" else f"{dialect}_"  # chat keeps the figure's first name
        print(budget_line(f"capture.cpu_{name}{mode}_ms", value * 1000, BUDGET_CPU_MS))
    return 0
