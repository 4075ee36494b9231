"""Interceptor added latency, durable ack included, against calling the engine directly (same run).

Brings up a Kafka broker (jars), the reference policy server and the
interceptor as separate processes; sends the same chat request (an ~8k-token
prompt, 512 generated tokens, ``ignore_eos``) at a fixed concurrency, directly
to the engine (asking for the same token fields the interceptor asks for, so
the engine does the same work) and through the interceptor, in alternating
rounds. Prints client-observed latency percentiles for both, their difference,
and the interceptor's own per-call overhead from its ``Server-Timing`` header
(time not spent waiting for the engine: parsing, hashing, encoding, the Kafka
ack, answering). Budgets (ARCHITECTURE §8): added latency p50 ≤ 3 ms, p99 ≤ 10 ms (proxy);
capture overhead p50 ≤ 1 ms, p99 ≤ 5 ms.

``--profile FILE`` records the capturing process with py-spy over the captured rounds
(``compose.tools.bench._pyspy``) and prints its top frames: the profiles of ``docs/perf/interceptor.md``.

``--engine vllm`` puts real vLLM (its CPU build from ``make vllm``, on the tiny
random-weight checkpoint) in place of the reference server, in both deployments: in
front of it as a proxy, and inside its server as ``--middleware`` (the baseline is then
the same server's uncaptured route). Decode speed is then the CPU engine's own.

A broker in production has run for days; a JVM started a second ago answers
its first thousands of produce requests several times slower (JIT warm-up).
So before measuring, the broker is warmed with ``--broker-warmup`` sequential
acknowledged records of a capture's size, and the last thousand of them give
the same-run baseline of a bare durable ack (``Kafka ack, direct``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from compose.tools.bench._measure import THREAD_PARTS, cpu_seconds, percentile, thread_cpu
from compose.tools.bench._pyspy import PySpy, top_frames
from compose.tools.bench.budgets import budget_line
from schemas.kafka.security import ENV_VAR as KAFKA_CONFIG_ENV
from schemas.kafka.security import KafkaSecurity, add_kafka_config_option


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="alternating direct/via rounds")
    parser.add_argument("--calls-per-round", type=int, default=128)
    parser.add_argument("--prompt-words", type=int, default=4100, help="~8k prompt tokens with the default")
    parser.add_argument("--gen-tokens", type=int, default=512)
    parser.add_argument("--decode-ms-per-token", type=float, default=5.0,
                        help="emulated engine decode time per token (0: the CPU engine answers in ms, and 64-way "
                             "concurrency then measures queueing on this machine, not the interceptor)")
    parser.add_argument("--broker-warmup", type=int, default=3000,
                        help="sequential acked records sent to the broker before measuring (0: none)")
    parser.add_argument("--deployment", choices=["proxy", "middleware", "both"], default="both",
                        help="proxy: tokentrail intercept in front of the engine; middleware: inside its server")
    parser.add_argument("--bootstrap", help="use this broker instead of starting one")
    add_kafka_config_option(parser, note="with --bootstrap only: the broker this tool starts itself is PLAINTEXT")
    parser.add_argument("--profile", type=Path, metavar="FILE",
                        help="py-spy raw profile of the capturing process (the proxy, or the engine's server with "
                             "the middleware) over the captured rounds only, to FILE (one per deployment: "
                             "FILE's stem gets the deployment's name); prints its top frames")
    parser.add_argument("--stream", action="store_true",
                        help="streamed calls (SSE, one chunk per token), as Claude Code and Codex make them: prints "
                             "the latency and CPU per call (Server-Timing is sent before a stream's capture, so no "
                             "overhead figure)")
    parser.add_argument("--engine", choices=["reference", "vllm"], default="reference",
                        help="reference: tokentrail policy (decode emulated); vllm: the real engine (CPU build, "
                             "`make vllm`) on the tiny random-weight checkpoint")


async def _load(url: str, body: dict, n: int, concurrency: int, timings: list[float] | None,
                stagger_s: float = 0.0, engine: list[float] | None = None,
                hop: list[float] | None = None, seeded: bool = True) -> list[float]:
    """``concurrency`` closed-loop clients; client i starts ``i * stagger_s / concurrency`` late, so that
    calls are in flight all the time but do not all finish at the same instant (as in a real run)."""
    import httpx

    latencies: list[float] = []
    remaining = iter(range(n))
    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=concurrency * 2)) as http:
        async def client(k: int) -> None:
            await asyncio.sleep(k * stagger_s / concurrency)
            for i in remaining:
                t0 = time.perf_counter()
                # Seeds vary the reference engine's outputs; vLLM's CPU build (0.32) dies on a
                # per-request seed ("CPU Generator does not use offset", EngineDeadError).
                sent = {**body, "seed": i} if seeded else body
                if sent.get("stream"):  # read to the end, as a harness does
                    async with http.stream("POST", url, json=sent) as r:
                        r.raise_for_status()
                        async for _ in r.aiter_raw():
                            pass
                    latencies.append(time.perf_counter() - t0)
                    continue
                r = await http.post(url, json=sent)
                latencies.append(time.perf_counter() - t0)
                r.raise_for_status()
                if timings is not None:
                    parts = dict(p.strip().partition(";dur=")[::2] for p in r.headers.get("server-timing", "").split(","))
                    timings.append(float(parts["tokentrail"]) / 1000)
                    if engine is not None:
                        engine.append(float(parts["engine"]) / 1000)
                    if hop is not None:  # what the server-side timings do not cover: the client's HTTP hop
                        hop.append(latencies[-1] - timings[-1] - (engine or [0.0])[-1])

        await asyncio.gather(*(client(k) for k in range(concurrency)))
    return latencies


def main(args: argparse.Namespace) -> int:
    from compose.rig.kafka.broker import ensure_jars, start_broker, stop_broker
    from compose.rig.stack import kafka_configs_of_args, role_security

    kafka_configs = kafka_configs_of_args(args)  # checked before anything starts
    run_dir = Path(tempfile.mkdtemp(prefix="tokentrail-bench-"))
    broker_dir = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        ensure_jars()
        broker_dir = run_dir / "kafka"
        bootstrap = start_broker(broker_dir).bootstrap
    try:
        acks = _warm_broker(bootstrap, args.broker_warmup, tag=time.strftime("%H%M%S"),
                            security=role_security(kafka_configs, "interceptor"))
        for deployment in (["proxy", "middleware"] if args.deployment == "both" else [args.deployment]):
            _run(args, deployment, bootstrap, run_dir / deployment, percentile(acks, 50) if acks else None,
                 kafka_configs)
        if acks:
            print(f"Kafka ack, direct        p50 {_ms(percentile(acks, 50))}   p99 {_ms(percentile(acks, 99))}   (bare acks=all "
                  f"produce of a capture-sized record, after {args.broker_warmup} warm-up records)")
    finally:
        if broker_dir is not None:
            stop_broker(broker_dir)
    return 0


def _run(args: argparse.Namespace, deployment: str, bootstrap: str, run_dir: Path, ack_p50: float | None,
         kafka_configs: dict[str, Path] | None = None) -> None:
    """One deployment: ``proxy`` (``tokentrail intercept`` in front of the engine: one more HTTP hop) or
    ``middleware`` (the capture inside the engine's server, as ``vllm serve --middleware``; the baseline is
    the same server's uncaptured route)."""
    import contextlib

    import httpx

    from compose.engines.vllm_rig.engine import SERVED_NAME, VllmEngine
    from compose.rig.stack import LocalStack

    prompt = " ".join(f"word{i % 977} and" for i in range(args.prompt_words // 2))
    body = {"model": SERVED_NAME if args.engine == "vllm" else "tokentrail-policy",
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": args.gen_tokens, "ignore_eos": True, "stream": args.stream}
    direct_body = {**body, "return_token_ids": True, "logprobs": True, "top_logprobs": 0, "include_reasoning": True}
    tag = time.strftime("%H%M%S")
    prefix = f"bench{deployment}{tag}."
    policy_args: tuple[str, ...] = ("--decode-ms-per-token", str(args.decode_ms_per_token))
    policy_env: dict[str, str] = {}
    middleware: tuple[str, ...] = ()
    if deployment == "middleware":
        middleware = ("--middleware", "producers.middleware.TokentrailMiddleware")
        policy_env = {"TOKENTRAIL_BOOTSTRAP": bootstrap, "TOKENTRAIL_TOPIC_PREFIX": prefix}
        if kafka_configs:  # the in-engine middleware reads only the environment (vLLM's too)
            policy_env[KAFKA_CONFIG_ENV] = str(kafka_configs["interceptor"])
    with contextlib.ExitStack() as running:
        engine_url = None
        engine_proc = None
        if args.engine == "vllm":
            engine = running.enter_context(VllmEngine(run_dir / "vllm", variant="random", env=policy_env,
                                                      extra_args=middleware))
            engine_url, engine_proc = engine.url, engine.proc
        else:
            policy_args += middleware
        stack = running.enter_context(LocalStack(
            bootstrap, run_dir, topic_prefix=prefix, with_pipeline=False, policy_args=policy_args,
            policy_env=policy_env, upstream_url=engine_url, kafka_configs=kafka_configs or {},
            interceptor_in_engine=engine_url is not None and deployment == "middleware"))
        capture_base = stack.interceptor_url if deployment == "proxy" else stack.policy_url
        via_url = f"{capture_base}/ng-rollout/bench-{tag}/training-token-capture/v1/chat/completions"
        direct_url = f"{stack.policy_url}/v1/chat/completions"
        # Warm both paths (engine tables, connections, the producer's id).
        seeded = args.engine != "vllm"
        asyncio.run(_load(direct_url, direct_body, 16, 8, None, seeded=seeded))
        asyncio.run(_load(via_url, body, 16, 8, None, seeded=seeded))
        direct: list[float] = []
        via: list[float] = []
        ours: list[float] = []
        engine_seen: list[float] = []
        hop: list[float] = []
        stagger = args.decode_ms_per_token * args.gen_tokens / 1000
        # CPU seconds (from /proc) of the process that captures: the interceptor (proxy), or the engine's
        # server with the capture inside it (middleware), over the uncaptured and the captured rounds.
        server = engine_proc.pid if engine_proc is not None else stack.services["policy"].proc.pid
        capturer = stack.services["interceptor"].proc.pid if deployment == "proxy" else server
        cpu = {"direct": 0.0, "via": 0.0}
        split = dict.fromkeys(THREAD_PARTS, 0.0)  # the capturer's CPU over the captured rounds, by thread and mode
        spies: list[PySpy] = []
        for round_no in range(args.rounds):
            before = _cpu_s(server)
            direct += asyncio.run(_load(direct_url, direct_body, args.calls_per_round, args.concurrency, None,
                                        stagger, seeded=seeded))
            cpu["direct"] += _cpu_s(server) - before
            if args.profile is not None:
                spies.append(PySpy(capturer, run_dir / f"profile.{round_no}.raw"))
                spies[-1].start()
            before, parts = _cpu_s(capturer), thread_cpu(capturer)
            via += asyncio.run(_load(via_url, body, args.calls_per_round, args.concurrency, ours, stagger,
                                     engine_seen, hop, seeded=seeded))
            cpu["via"] += _cpu_s(capturer) - before
            for part, seconds in thread_cpu(capturer).items():
                split[part] += seconds - parts[part]
            if spies:
                spies[-1].stop()
        prompt_tokens = _prompt_tokens(stack.policy_url, body)
        metrics_path = "/metrics" if deployment == "proxy" else "/tokentrail/metrics"
        metrics = httpx.get(f"{capture_base}{metrics_path}", timeout=10).text
    decode = ("real vLLM (CPU build), tiny random-weight checkpoint" if args.engine == "vllm" else
              f"reference engine, decode {args.decode_ms_per_token} ms/token")
    print(f"== {deployment}: {len(via)} {'streamed ' if args.stream else ''}calls per path, concurrency "
          f"{args.concurrency}, prompt {prompt_tokens} tokens, {args.gen_tokens} generated tokens, {decode}, durable "
          "ack (acks=all) on every captured call")
    baseline = "direct to engine" if deployment == "proxy" else "uncaptured route"
    print(f"{baseline:<24} p50 {_ms(percentile(direct, 50))}   p99 {_ms(percentile(direct, 99))}")
    print(f"{'captured':<24} p50 {_ms(percentile(via, 50))}   p99 {_ms(percentile(via, 99))}")
    print(f"{'added (client view)':<24} p50 {_ms(percentile(via, 50) - percentile(direct, 50))}   "
          f"p99 {_ms(percentile(via, 99) - percentile(direct, 99))}   (budget p50 <= 3 ms, p99 <= 10 ms)")
    if args.stream:
        _stream_figures(args, deployment, cpu, len(via), len(direct))
        if deployment == "proxy":
            _print_split(split, len(via))
        _print_profile(args, deployment, spies)
        return
    print(f"{'capture overhead':<24} p50 {_ms(percentile(ours, 50))}   p99 {_ms(percentile(ours, 99))}   "
          f"mean {_ms(statistics.fmean(ours))}   (budget p50 <= 1 ms, p99 <= 5 ms; Server-Timing: all but the engine "
          "wait, durable ack included)")
    print(f"{'engine as seen by it':<24} p50 {_ms(percentile(engine_seen, 50))}   p99 {_ms(percentile(engine_seen, 99))}")
    what = ("the proxy's extra HTTP hop" if deployment == "proxy" else
            "the server's own HTTP hop, which the uncaptured route pays too")
    print(f"{'client <-> server':<24} p50 {_ms(percentile(hop, 50))}   p99 {_ms(percentile(hop, 99))}   "
          f"(client latency less both Server-Timing parts: {what})")
    print(f"{'  of which Kafka ack':<24} p50 <= {_histpercentile(metrics, 'tokentrail_publish_seconds', 50) * 1000:.1f} ms"
          f"   p99 <= {_histpercentile(metrics, 'tokentrail_publish_seconds', 99) * 1000:.1f} ms   (histogram bucket bounds)")
    per_via, per_direct = cpu["via"] / len(via), cpu["direct"] / len(direct)
    if deployment == "proxy":
        capture_cpu = per_via
        print(f"{'interceptor CPU':<24} {_ms(per_via)} per captured call   (the proxy process, from /proc: HTTP in and "
              "out, the capture, the producer)")
        _print_split(split, len(via))
    else:
        capture_cpu = per_via - per_direct
        print(f"{'server CPU':<24} {_ms(per_via)} per captured call, {_ms(per_direct)} per uncaptured call: the "
              f"capture adds {_ms(capture_cpu)} ({capture_cpu / per_direct:+.0%} of the server's own), from /proc")
    _print_profile(args, deployment, spies)
    name = f"interceptor.{deployment}.c{args.concurrency}"
    # the lines of `make bench`'s table (compose.tools.bench.budgets)
    ack_ms = ack_p50 * 1000 if ack_p50 else None
    if capture_cpu > 0:
        print(budget_line(f"{name}.cpu_per_call_ms", capture_cpu * 1000, 1.5))
    else:  # the server's own CPU per call varies by more than the capture costs: no figure to judge
        print(f"{'':<24} the capture's CPU is within the noise of the server's own: no cpu_per_call budget line "
              "(more calls per round resolve it)")
    if deployment == "middleware" and args.engine == "vllm":  # the API server's own CPU per call is vLLM's
        print(budget_line(f"{name}.api_server_cpu_ratio", per_via / per_direct, 1.10))
    print(budget_line(f"{name}.overhead_p50_ms", percentile(ours, 50) * 1000, 1.0, baseline=ack_ms))
    print(budget_line(f"{name}.overhead_p99_ms", percentile(ours, 99) * 1000, 5.0, baseline=ack_ms))
    print(budget_line(f"{name}.added_p50_ms", (percentile(via, 50) - percentile(direct, 50)) * 1000, 3.0))


def _print_profile(args: argparse.Namespace, deployment: str, spies: list[PySpy]) -> None:
    if args.profile is None:
        return
    out = args.profile.with_stem(f"{args.profile.stem}.{deployment}")
    out.write_text("".join(spy.out.read_text() for spy in spies if spy.out.exists()))
    print(f"profile of the capturing process, captured rounds only: {out} (py-spy raw)")
    for line in top_frames(out.read_text(), what=f"the {'proxy' if deployment == 'proxy' else 'server'} "
                                                 "during the captured rounds"):
        print(f"  {line}")


def _print_split(split: dict[str, float], calls: int) -> None:
    print(f"{'  by thread':<24} " + ", ".join(f"{part} {split[part] / calls * 1000:.2f}" for part in THREAD_PARTS)
          + " ms per call (/proc/<pid>/task; 10 ms ticks)")


def _stream_figures(args: argparse.Namespace, deployment: str, cpu: dict[str, float], n_via: int,
                    n_direct: int) -> None:
    """A streamed run's CPU figure: the capturing process's per call, as for JSON calls."""
    per_via, per_direct = cpu["via"] / n_via, cpu["direct"] / n_direct
    capture_cpu = per_via if deployment == "proxy" else per_via - per_direct
    what = "the proxy process" if deployment == "proxy" else f"over the uncaptured route's {_ms(per_direct)}"
    print(f"{'capture CPU, streamed':<24} {_ms(capture_cpu)} per captured call ({what}, from /proc)")
    if capture_cpu > 0:
        print(budget_line(f"interceptor.{deployment}.c{args.concurrency}.stream.cpu_per_call_ms",
                          capture_cpu * 1000, 1.5))


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (its threads included), from /proc."""
    return cpu_seconds(Path(f"/proc/{pid}/stat").read_text(), os.sysconf("SC_CLK_TCK"))


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:8.2f} ms"


def _warm_broker(bootstrap: str, n: int, tag: str, size: int = 6 << 10,
                 security: KafkaSecurity | None = None) -> list[float]:
    """Send ``n`` acked records one at a time; the ack latencies of the last 1000 (seconds)."""
    if n <= 0:
        return []
    import confluent_kafka

    from schemas.kafka.config import producer_config

    producer = confluent_kafka.Producer(producer_config(bootstrap, linger_ms=0, security=security))
    topic, value, out = f"bench{tag}.warmup", b"x" * size, []
    for i in range(n):
        done: list = []

        def delivered(err: object, msg: object, done: list[object] = done) -> None:
            done.append(err)

        start = time.perf_counter()
        producer.produce(topic, key=str(i % 64).encode(), value=value, on_delivery=delivered)
        while not done:
            producer.poll(0.0005)
        if done[0] is not None:
            raise RuntimeError(f"broker warm-up: {done[0]}")
        out.append(time.perf_counter() - start)
    producer.flush(10)
    return out[-1000:]


def _histpercentile(text: str, name: str, p: float) -> float:
    """Upper bound of the bucket holding the p-th percentile of a Prometheus histogram."""
    buckets = []
    for line in text.splitlines():
        if line.startswith(f"{name}_bucket{{"):
            le = line.split('le="')[1].split('"')[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), float(line.rsplit(" ", 1)[1])))
    total = buckets[-1][1] if buckets else 0
    for bound, count in buckets:
        if total and count >= total * p / 100:
            return bound
    return float("nan")


def _prompt_tokens(policy_url: str, body: dict) -> int:
    import httpx

    r = httpx.post(f"{policy_url}/tokenize", json={"messages": body["messages"]}, timeout=30)
    return int(r.json().get("count", len(r.json().get("tokens", []))))
