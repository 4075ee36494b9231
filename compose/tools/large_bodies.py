"""``python -m compose.tools.large_bodies``: /healthz latency while large request bodies are captured (issue 26).

Four ~15 MB chat bodies (under the 16 MiB limit) are sent at once to an in-process interceptor over
a stand-in engine, after one small capture (the first capture builds the event codec, ~0.1 s once per
process: not the bodies' cost); meanwhile ``/healthz`` is polled every 5 ms. Prints the poll latencies'
p50/p99/max, the process CPU for the burst and the RSS before the burst and after it (once the
interceptor shut down). The budget: p99 <= 50 ms. A measurement, not a test: it depends on the machine.

Figures on the development machine (2 cores, host load 1.3-1.7; 3 runs each, before and after alternating):

* before (every preparation on the event loop): one-string p99 504-590 ms (2 polls in the burst), RSS
  66 -> 123 MB; many-messages p99 5.0-5.4 s (the loop held for the whole burst), RSS 68 -> 130 MB.
* after (``producers.call.large_bodies``: bodies over 1 MiB are read, described, encoded and freed in
  one lane thread; then cycles collected and the heap trimmed): one-string p50 6-7 ms, p99 = max 162-180
  ms (40-45 polls: the one stall is the four bodies' arrival, copied on the loop at the same instant),
  RSS 66 -> 66 MB; many-messages p50 5.9 ms, p99 37-103 ms, max 152-181 ms, RSS 69 -> 82-86 MB. What
  remains above 50 ms is one GIL-holding C call per body: orjson's parse of 15 MB of short messages
  (~150 ms here), which a thread cannot interrupt; 5-6 of ~500 polls, so the p99 sits on the budget's
  edge. The burst's CPU grew (5.0-5.3 s -> 6.3-7.6 s): the GIL changes hands every 5 ms while it runs.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import json
import resource
import statistics
import time

import httpx

from producers.call.large_bodies import freeze_startup_heap
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


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # every thread of the process
    return usage.ru_utime + usage.ru_stime


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
    freeze_startup_heap()  # as the proxy's lifespan does once started
    n = int(size_mb * 1e6 / 57)  # ~57 bytes per message
    if shape == "one-string":  # one long user message: the cost is the JSON parse itself
        body = json.dumps({"model": "policy", "max_tokens": 1, "messages": [
            {"role": "user", "content": "x" * int(size_mb * 1e6)}]}).encode()
        n = len(body) // 57
    else:  # many short messages: the per-message work of the capture dominates
        body = json.dumps({"model": "policy", "max_tokens": 1, "messages": [
            {"role": "user", "content": f"message {i:08d} of many"} for i in range(n)]}).encode()
    # C doubles, not float objects: a float kept from each poll is a small object allocated while a body is
    # parsed in the lane's thread, and it pins the allocator's arena among the parsed objects (the process
    # under measurement must not be one the tool perturbs).
    latencies = array.array("d")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://tt", timeout=300) as http:
        await http.get("/healthz")
        # One small capture first: the first one builds the event codec (~0.1 s, once per process), which
        # is not the bodies' cost.
        await http.post("/ng-rollout/warm/training-token-capture/v1/chat/completions",
                        json={"model": "policy", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})
        rss0 = _rss_mb()
        done = asyncio.Event()

        async def poll() -> None:
            while not done.is_set():  # the latency counts the time the loop kept the poll from being sent
                t = time.perf_counter()
                await asyncio.sleep(0.005)
                await http.get("/healthz")
                latencies.append(time.perf_counter() - t - 0.005)

        poller = asyncio.create_task(poll())
        t0, cpu0 = time.perf_counter(), _cpu_s()
        results = await asyncio.gather(*(http.post(f"/ng-rollout/r-{i}/training-token-capture/v1/chat/completions",
                                                   content=body) for i in range(bodies)))
        wall, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
        statuses = sorted({r.status_code for r in results})
        if statuses != [200]:
            print(results[0].text[:300])
        done.set()
        await poller
    del body, results
    await app.shutdown()
    await upstream.aclose()
    latencies = array.array("d", sorted(latencies))
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    print(json.dumps({"shape": shape, "bodies": bodies, "body_mb": round(n * 57 / 1e6, 1), "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "statuses": statuses,
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
