"""``python -m compose.tools.large_bodies``: /healthz latency while large request bodies are captured (issue 26).

Four ~15 MB chat bodies (under the 16 MiB limit) are sent at once to an in-process interceptor over
a stand-in engine; meanwhile ``/healthz`` is polled every 5 ms. Prints the poll latencies' p50/p99/max
and the process RSS before and after. The budget: p99 <= 50 ms; not met yet (issue 26 item 3, finding 2):
with ``--shape many-messages`` the per-message work of a capture (the dialect's checks, lineage
hashing, the upstream encode) runs on the event loop, so moving only the JSON parse to a thread does
not bring the p99 down. A measurement, not a test: it depends on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import time

import httpx

from producers.http.app import Interceptor
from producers.settings import InterceptorSettings


class _Publisher:
    """Acknowledges every record at once (no Kafka): the benchmark measures the HTTP edge."""

    def __init__(self) -> None:
        self.count = 0

    async def produce(self, topic: str, key: bytes, value: bytes) -> tuple[int, int]:
        self.count += 1
        return 0, self.count

    async def close(self) -> int:
        return 0


def _engine(request: httpx.Request) -> httpx.Response:
    if request.method == "GET":
        return httpx.Response(200, json={"object": "list", "data": [{"id": "policy", "max_model_len": 10**9}]})
    return httpx.Response(200, json={"id": "x", "object": "chat.completion", "model": "policy",
                                     "prompt_token_ids": [1], "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": "ok"}, "token_ids": [2],
                                     "logprobs": {"content": [{"token": "ok", "logprob": -0.1}]}}]})


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def main(bodies: int, size_mb: float, shape: str) -> int:
    settings = InterceptorSettings(upstream_url="http://engine", bootstrap="unused:9092", control_token="t" * 16)
    upstream = httpx.AsyncClient(base_url="http://engine", transport=httpx.MockTransport(_engine))
    app = Interceptor(settings, publisher=_Publisher(), upstream=upstream)  # type: ignore[arg-type]
    await app.startup()
    n = int(size_mb * 1e6 / 57)  # ~57 bytes per message
    if shape == "one-string":  # one long user message: the cost is the JSON parse itself
        body = json.dumps({"model": "policy", "max_tokens": 1, "messages": [
            {"role": "user", "content": "x" * int(size_mb * 1e6)}]}).encode()
        n = len(body) // 57
    else:  # many short messages: the per-message work of the capture dominates
        body = json.dumps({"model": "policy", "max_tokens": 1, "messages": [
            {"role": "user", "content": f"message {i:08d} of many"} for i in range(n)]}).encode()
    rss0 = _rss_mb()
    latencies: list[float] = []
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://tt", timeout=300) as http:
        await http.get("/healthz")
        done = asyncio.Event()

        async def poll() -> None:
            while not done.is_set():  # the latency counts the time the loop kept the poll from being sent
                t = time.perf_counter()
                await asyncio.sleep(0.005)
                await http.get("/healthz")
                latencies.append(time.perf_counter() - t - 0.005)

        poller = asyncio.create_task(poll())
        t0 = time.perf_counter()
        results = await asyncio.gather(*(http.post(f"/ng-rollout/r-{i}/training-token-capture/v1/chat/completions",
                                                   content=body) for i in range(bodies)))
        wall = time.perf_counter() - t0
        statuses = sorted({r.status_code for r in results})
        if statuses != [200]:
            print(results[0].text[:300])
        done.set()
        await poller
    del body, results
    await app.shutdown()
    await upstream.aclose()
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    print(json.dumps({"shape": shape, "bodies": bodies, "body_mb": round(n * 57 / 1e6, 1), "wall_s": round(wall, 2), "statuses": statuses,
                      "healthz_polls": len(latencies), "p50_ms": round(statistics.median(latencies) * 1e3, 1),
                      "p99_ms": round(p99 * 1e3, 1), "max_ms": round(latencies[-1] * 1e3, 1),
                      "rss_mb_before": round(rss0), "rss_mb_after": round(_rss_mb())}))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bodies", type=int, default=4)
    parser.add_argument("--size-mb", type=float, default=15.0)
    parser.add_argument("--shape", choices=["one-string", "many-messages"], default="one-string")
    args = parser.parse_args()
    raise SystemExit(asyncio.run(main(args.bodies, args.size_mb, args.shape)))
