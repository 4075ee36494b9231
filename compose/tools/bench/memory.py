"""The interceptor's memory with 1,000 and 10,000 rollouts in flight: its lineage index, and its spool.

Each measurement runs in a fresh process: the interceptor in process in front of an in-memory
engine (``httpx.MockTransport``, ``--prompt-tokens`` / ``--gen-tokens`` per call) and an acked
producer, ``--calls`` calls per rollout and no rollout finished, so every rollout stays in the
lineage index. RSS (``VmRSS``) is read after a warm-up and at the end (after a full collection);
the growth over the rollouts is printed per rollout and per call. Three modes:

- ``index``: the default index, metadata only (fingerprints, digests per call);
- ``prefix``: the index keeping each call's cumulative ids too, as it does with prefix supply on
  (``--prefix-supply``; bounded by ``index_max_tokens``);
- ``spool``: Kafka down for the whole run (every event refused), so every event goes to the
  fsynced spool (``--spool-dir``) and waits there.

docs/SCALING.md states these per rollout. Linear means the per-rollout figure at 10,000 is the
one at 1,000 (within noise); the bench prints the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from compose.tools.bench.budgets import budget_line, figure_line

MODES = ("index", "prefix", "spool")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rollouts", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--calls", type=int, default=3, help="calls per rollout")
    parser.add_argument("--prompt-tokens", type=int, default=1024, help="prompt ids per call")
    parser.add_argument("--gen-tokens", type=int, default=128)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--one", nargs=2, metavar=("MODE", "ROLLOUTS"), help=argparse.SUPPRESS)


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


async def _one(args: argparse.Namespace, mode: str, rollouts: int) -> dict[str, Any]:
    import httpx

    from producers.http.app import Interceptor
    from producers.settings import InterceptorSettings
    from schemas.kafka.bridge import PublishFailed

    class Producer:
        async def produce(self, topic: str, key: bytes | None, value: bytes, headers: Any = None) -> tuple[int, int]:
            if mode == "spool":
                raise PublishFailed("the benchmark's broker is down", possibly_persisted=False)
            return 0, 0

        async def close(self, timeout_s: float | None = None) -> int:
            return 0

    turn = [0]

    def engine(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(200, json={"object": "list", "data": [
                {"id": "policy", "object": "model", "max_model_len": 1 << 20}]})
        body = json.loads(request.content)
        turn[0] += 1
        gen = [(turn[0] * 31 + k) % 30000 + 10 for k in range(args.gen_tokens)]
        prompt = [(len(body["messages"]) * 7 + k) % 30000 + 10 for k in range(args.prompt_tokens)]
        message = {"role": "assistant", "content": f"answer {turn[0]}"}
        return httpx.Response(200, json={
            "id": "x", "object": "chat.completion", "created": 0, "model": "policy", "prompt_token_ids": prompt,
            "choices": [{"index": 0, "message": message, "finish_reason": "stop", "stop_reason": None,
                         "token_ids": gen, "logprobs": {"content": [{"token": "t", "logprob": -0.5} for _ in gen]}}],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(gen)}})

    spool = tempfile.mkdtemp(prefix="tokentrail-bench-spool-") if mode == "spool" else None
    settings = InterceptorSettings(upstream_url="http://engine", bootstrap="unused:9092", follow_versions=False,
                                   spool_dir=spool, index_max_rollouts=max(65_536, rollouts * 2),
                                   index_max_tokens=1 << 40)
    client = httpx.AsyncClient(base_url="http://engine", transport=httpx.MockTransport(engine))
    app = Interceptor(settings, publisher=Producer(), upstream=client)  # type: ignore[arg-type]
    await app.startup()
    if mode == "prefix":  # as with --prefix-supply, without the engine's render route this bench has not
        app.core.index.keep_tokens = True
    if mode == "spool":  # the drainer retries a broker that never answers; it must not run meanwhile
        app.core.writer._kick = lambda: None  # type: ignore[method-assign]
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://tt", timeout=60)

    async def rollout(rid: str) -> None:
        messages: list[dict[str, Any]] = [{"role": "user", "content": f"task {rid}"}]
        for _ in range(args.calls):
            r = await http.post(f"/ng-rollout/{rid}/training-token-capture/v1/chat/completions",
                                json={"model": "policy", "messages": messages})
            r.raise_for_status()
            messages += [r.json()["choices"][0]["message"], {"role": "user", "content": "go on"}]

    for i in range(50):
        await rollout(f"warm{i}")
    gc.collect()
    before = _rss()
    for start in range(0, rollouts, 64):
        await asyncio.gather(*(rollout(f"r{i}") for i in range(start, min(rollouts, start + 64))))
    gc.collect()
    after = _rss()
    in_index = len(app.core.index)
    spooled = app.core.writer.spooled
    await http.aclose()
    return {"mode": mode, "rollouts": rollouts, "calls": rollouts * args.calls, "bytes": after - before,
            "indexed": in_index, "spooled": spooled}


def main(args: argparse.Namespace) -> int:
    if args.one:
        mode, n = args.one
        print(json.dumps(asyncio.run(_one(args, mode, int(n)))))
        return 0
    print(f"interceptor RSS growth with rollouts in flight: {args.calls} calls each, {args.prompt_tokens}-token "
          f"prompts, {args.gen_tokens} generated tokens, none finished (one fresh process per row)")
    print(f"{'mode':<8} {'rollouts':>9} {'RSS growth':>12} {'per rollout':>12} {'per call':>10}  held")
    per: dict[str, list[float]] = {}
    for mode in args.modes:
        for n in args.rollouts:
            argv = [sys.executable, "-m", "compose.cli", "bench", "memory", "--calls", str(args.calls),
                    "--prompt-tokens", str(args.prompt_tokens), "--gen-tokens", str(args.gen_tokens),
                    "--one", mode, str(n)]
            out = subprocess.run(argv, capture_output=True, text=True, check=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            per_rollout = row["bytes"] / n
            per.setdefault(mode, []).append(per_rollout)
            held = f"{row['indexed']} rollouts indexed" + (f", {row['spooled']} events spooled" if mode == "spool"
                                                           else "")
            print(f"{mode:<8} {n:>9,} {row['bytes'] / 1e6:>9.1f} MB {per_rollout / 1e3:>9.2f} KB "
                  f"{per_rollout / args.calls / 1e3:>7.2f} KB  {held}")
    for mode, values in per.items():
        if len(values) >= 2 and values[0] > 0:
            ratio = values[-1] / values[0]
            print(budget_line(f"memory.{mode}_linearity", ratio, 1.25))
        print(figure_line(f"memory.{mode}_kb_per_rollout", values[-1] / 1e3))
    return 0
