"""Interceptor added latency, durable ack included, against calling the engine directly (same run).

Brings up a Kafka broker (jars), the reference policy server and the
interceptor as separate processes; sends the same chat request (an ~8k-token
prompt, 512 generated tokens, ``ignore_eos``) at a fixed concurrency, directly
to the engine (asking for the same token fields the interceptor asks for, so
the engine does the same work) and through the interceptor, in alternating
rounds. Prints client-observed latency percentiles for both, their difference,
and the interceptor's own per-call overhead from its ``Server-Timing`` header
(time not spent waiting for the engine: parsing, hashing, encoding, the Kafka
ack, answering). Budget: p50 ≤ 3 ms, p99 ≤ 15 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="alternating direct/via rounds")
    parser.add_argument("--calls-per-round", type=int, default=128)
    parser.add_argument("--prompt-words", type=int, default=5400, help="~8k prompt tokens with the default")
    parser.add_argument("--gen-tokens", type=int, default=512)
    parser.add_argument("--bootstrap", help="use this broker instead of starting one")


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


async def _load(url: str, body: dict, n: int, concurrency: int, timings: list[float] | None) -> list[float]:
    import httpx

    latencies: list[float] = []
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=concurrency * 2)) as http:
        async def one(i: int) -> None:
            async with sem:
                payload = {**body, "seed": i}
                t0 = time.perf_counter()
                r = await http.post(url, json=payload)
                latencies.append(time.perf_counter() - t0)
                r.raise_for_status()
                if timings is not None:
                    timing = r.headers.get("server-timing", "")
                    for part in timing.split(","):
                        name, _, dur = part.strip().partition(";dur=")
                        if name == "tokentrail":
                            timings.append(float(dur) / 1000)

        await asyncio.gather(*(one(i) for i in range(n)))
    return latencies


def main(args: argparse.Namespace) -> int:
    from compose.kafka_broker import ensure_jars, start_broker, stop_broker
    from compose.stack import LocalStack

    run_dir = Path(tempfile.mkdtemp(prefix="tokentrail-bench-"))
    broker_dir = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        ensure_jars()
        broker_dir = run_dir / "kafka"
        bootstrap = start_broker(broker_dir).bootstrap
    prompt = " ".join(f"word{i % 977} and" for i in range(args.prompt_words // 2))
    body = {"model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": args.gen_tokens,
            "ignore_eos": True}
    direct_body = {**body, "return_token_ids": True, "logprobs": True, "top_logprobs": 0, "include_reasoning": True}
    tag = time.strftime("%H%M%S")
    try:
        with LocalStack(bootstrap, run_dir, topic_prefix=f"bench{tag}.", with_pipeline=False) as stack:
            via_url = f"{stack.interceptor_url}/ng-rollout/bench-{tag}/training-token-capture/v1/chat/completions"
            direct_url = f"{stack.policy_url}/v1/chat/completions"
            # Warm both paths (engine tables, connections, the producer's id).
            asyncio.run(_load(direct_url, direct_body, 16, 8, None))
            asyncio.run(_load(via_url, body, 16, 8, None))
            direct: list[float] = []
            via: list[float] = []
            ours: list[float] = []
            for _ in range(args.rounds):
                direct += asyncio.run(_load(direct_url, direct_body, args.calls_per_round, args.concurrency, None))
                via += asyncio.run(_load(via_url, body, args.calls_per_round, args.concurrency, ours))
            prompt_tokens = _prompt_tokens(stack.policy_url, body)
    finally:
        if broker_dir is not None:
            stop_broker(broker_dir)
    ms = lambda v: f"{v * 1000:8.2f} ms"  # noqa: E731
    print(f"{len(via)} calls per path, concurrency {args.concurrency}, prompt {prompt_tokens} tokens, "
          f"{args.gen_tokens} generated tokens, durable ack (acks=all) on every captured call")
    print(f"direct to engine       p50 {ms(_pct(direct, 50))}   p99 {ms(_pct(direct, 99))}")
    print(f"through interceptor    p50 {ms(_pct(via, 50))}   p99 {ms(_pct(via, 99))}")
    print(f"added (client view)    p50 {ms(_pct(via, 50) - _pct(direct, 50))}   p99 {ms(_pct(via, 99) - _pct(direct, 99))}")
    print(f"interceptor overhead   p50 {ms(_pct(ours, 50))}   p99 {ms(_pct(ours, 99))}   "
          f"mean {ms(statistics.fmean(ours))}   (Server-Timing; budget p50 <= 3 ms, p99 <= 15 ms)")
    return 0


def _prompt_tokens(policy_url: str, body: dict) -> int:
    import httpx

    r = httpx.post(f"{policy_url}/tokenize", json={"messages": body["messages"]}, timeout=30)
    return int(r.json().get("count", len(r.json().get("tokens", []))))
