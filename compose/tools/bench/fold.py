"""Fold throughput per worker and state bytes written per event (budget, ARCHITECTURE §8: ≥ 5,000 events/s, ≤ 1.1×).

The workload is concurrent multi-turn agent rollouts as the interceptor
publishes them: a root call with a long system prompt, then calls whose
prompts are delta-encoded against their verified parent (a few hundred new
prompt tokens: a tool result and the harness' turn) and a few hundred sampled
tokens with their log-probs, and a RolloutFinished per rollout; the rollouts'
events interleave as they would on a partition.

Two measurements of the same events:

1. the pure fold over an in-memory state (``processors.replay``, with Kafka positions, as live);
2. a real ``tokentrail process`` worker (Faust, RocksDB through rocksdict) on
   a real broker (``--bootstrap``, else a jar broker it starts): the events are
   published first, then one worker folds them; its rate is the events over
   the span between the Kafka timestamps of its first changelog record and its
   last changelog or snapshot record (so start-up and group join are left
   out), its state bytes are read back from the changelog (one record per
   table write).

"Bytes written per event" is key + value bytes of the state writes over the
event's record bytes.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

BUDGET_EVENTS_S = 5000.0  # ARCHITECTURE §8
BUDGET_WRITE_AMP = 1.1


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rollouts", type=int, default=200)
    parser.add_argument("--calls", type=int, default=30, help="model calls per rollout")
    parser.add_argument("--system-tokens", type=int, default=3000, help="the root call's prompt")
    parser.add_argument("--new-tokens", type=int, nargs=2, default=(150, 450), metavar=("MIN", "MAX"),
                        help="new prompt tokens per call (tool result + turn)")
    parser.add_argument("--gen-tokens", type=int, nargs=2, default=(100, 400), metavar=("MIN", "MAX"))
    parser.add_argument("--concurrent", type=int, default=16, help="rollouts interleaved at a time")
    parser.add_argument("--repeat", type=int, default=3, help="pure-fold repetitions (the best is reported)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--bootstrap", help="broker for the worker measurement (default: start a jar broker)")
    parser.add_argument("--no-worker", action="store_true", help="only the pure fold")


def workload(args: argparse.Namespace) -> list[tuple[bytes, bytes]]:
    """Encoded (key, value) records of ``args.rollouts`` interleaved agent rollouts."""
    from schemas.codec import encode_event
    from schemas.hashing import compute_digest
    from schemas.records import CallCaptured, CallFacts, ParentResolution, RolloutEvent, RolloutFinished

    rng = random.Random(args.seed)
    clock = iter(range(1_700_000_000_000_000, 1 << 62))

    def ids(n: int) -> list[int]:
        return [rng.randrange(150_000) for _ in range(n)]

    def rollout(rid: str) -> list[bytes]:
        events: list[bytes] = []
        cum: list[int] = []
        parent: CallCaptured | None = None
        for turn in range(args.calls):
            new = ids(args.system_tokens if parent is None else rng.randint(*args.new_tokens))
            gen = ids(rng.randint(*args.gen_tokens))
            full = cum + new + gen
            text = " ".join(f"w{t % 997}" for t in gen)  # what the harness sees, ~1 word per token
            call = CallCaptured(
                model_call_id=uuid.UUID(int=rng.getrandbits(128)).hex, created_at=turn * 1.5,
                prompt_token_ids=new if parent else cum + new, prompt_is_delta=parent is not None,
                generation_token_ids=gen, generation_log_probs=[-rng.random() * 4 for _ in gen],
                output_items_json=json.dumps([{"type": "message", "role": "assistant",
                                               "content": [{"type": "output_text", "text": text}]}]),
                token_item_index=0, cum_len=len(full), digest=compute_digest(full),
                parent_call_id=parent.model_call_id if parent else None,
                parent_resolution=ParentResolution.RESOLVED if parent else ParentResolution.ROOT,
                parent_digest=parent.digest if parent else "",
                request_fingerprint=parent.continuation_fingerprint if parent else "",
                continuation_fingerprint=f"{rng.getrandbits(256):064x}", continuation_context_len=2 * turn + 2,
                continuation_context_digest=f"{rng.getrandbits(256):064x}",
                facts=CallFacts(route="/v1/chat/completions", requested_model="policy", served_model="policy",
                                tools_present=True, sampling_json='{"temperature": 1.0}', user_agent="bench/1.0"),
            )
            events.append(encode_event(RolloutEvent(event_id=uuid.UUID(int=rng.getrandbits(128)).hex, rollout_id=rid,
                                                    emitted_at=next(clock), source="bench", body=call)))
            cum, parent = full, call
        events.append(encode_event(RolloutEvent(event_id=uuid.UUID(int=rng.getrandbits(128)).hex, rollout_id=rid,
                                                emitted_at=next(clock), source="bench",
                                                body=RolloutFinished(result_json='{"reward": 1.0}'))))
        return events

    records: list[tuple[bytes, bytes]] = []
    waiting = [f"bench-{i:05d}" for i in range(args.rollouts)]
    active: dict[str, list[bytes]] = {}
    while waiting or active:
        while waiting and len(active) < args.concurrent:
            rid = waiting.pop(0)
            active[rid] = rollout(rid)
        rid = rng.choice(sorted(active))
        records.append((rid.encode(), active[rid].pop(0)))
        if not active[rid]:
            del active[rid]
    return records


def pure_fold(records: list[tuple[bytes, bytes]], repeat: int) -> tuple[float, float, float]:
    """(best events/s, capture write bytes / capture event bytes, all write bytes / all event bytes)."""
    from processors.replay import replay

    best = 0.0
    for _ in range(repeat):
        start = time.perf_counter()
        for _step in replay(records, offsets_from=0):
            pass
        best = max(best, len(records) / (time.perf_counter() - start))
    written = event_bytes = cap_written = cap_bytes = 0
    for (key, value), step in zip(records, replay(records, offsets_from=0)):
        res = step.result
        w = sum(len(k) + len(v or b"") for k, v in res.writes.items())
        written, event_bytes = written + w, event_bytes + len(key) + len(value)
        if not res.emitted:  # the captures (finishes also assemble a snapshot, which is not state)
            cap_written, cap_bytes = cap_written + w, cap_bytes + len(key) + len(value)
    return best, cap_written / cap_bytes, written / event_bytes


def faust_worker(records: list[tuple[bytes, bytes]], bootstrap: str, run_dir: Path, rollouts: int) -> dict:
    """Publish ``records``, let one worker fold them, and read its changelog and snapshots back."""
    import confluent_kafka

    from schemas.kafka.admin import ensure_topics, produce_all
    from schemas.kafka.config import producer_config
    from schemas.kafka.topics import topic_names

    tag = uuid.uuid4().hex[:8]
    prefix, app_id = f"benchfold{tag}.", f"benchfold-{tag}"
    names = topic_names(prefix)
    ensure_topics(bootstrap, names)
    # The interceptor's producer settings (idempotent, acks=all, Java-compatible partitioner), batched.
    produce_all(confluent_kafka.Producer(producer_config(bootstrap, linger_ms=20)), names.rollout_events, records)
    log = run_dir / "worker.log"
    with open(log, "wb") as out:
        worker = subprocess.Popen([sys.executable, "-m", "compose.cli", "process", "--bootstrap", bootstrap,
                                   "--data-dir", str(run_dir / "worker"), "--app-id", app_id, "--topic-prefix", prefix],
                                  stdout=out, stderr=subprocess.STDOUT)
    try:
        snapshots = _drain(bootstrap, names.snapshots, until=rollouts, worker=worker, log=log)
    finally:
        worker.terminate()
        worker.wait(60)
    changelog = _drain(bootstrap, f"{app_id}-rollout-state-changelog", until=None)
    first, last = min(ts for ts, _ in changelog), max(ts for ts, _ in snapshots + changelog)
    return {"events_s": len(records) / max((last - first) / 1000, 1e-3),
            "state_bytes": sum(size for _, size in changelog), "snapshots": len(snapshots),
            "seconds": (last - first) / 1000}


def _drain(bootstrap: str, topic: str, until: int | None, worker=None, log=None,
           timeout: float = 600.0) -> list[tuple[int, int]]:
    """(timestamp ms, key + value bytes) of the topic's records: ``until`` of them, or all there are now."""
    import confluent_kafka

    from schemas.kafka.topics import MAX_MESSAGE_BYTES

    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}",
                                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                                         "fetch.message.max.bytes": MAX_MESSAGE_BYTES,
                                         "max.partition.fetch.bytes": MAX_MESSAGE_BYTES})
    consumer.subscribe([topic])
    out: list[tuple[int, int]] = []
    deadline, idle_since = time.monotonic() + timeout, time.monotonic()
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                out.append((msg.timestamp()[1], len(msg.key() or b"") + len(msg.value() or b"")))
                idle_since = time.monotonic()
            if until is not None and len(out) >= until:
                return out
            if until is None and out and time.monotonic() - idle_since > 3:
                return out
            if worker is not None and worker.poll() is not None:
                raise RuntimeError(f"the worker exited with {worker.returncode}; see {log}")
        raise RuntimeError(f"timed out reading {topic} ({len(out)} records)")
    finally:
        consumer.close()


def main(args: argparse.Namespace) -> int:
    records = workload(args)
    mean = sum(len(k) + len(v) for k, v in records) / len(records)
    print(f"workload: {args.rollouts} rollouts x {args.calls} calls, {args.concurrent} interleaved: "
          f"{len(records):,} events, mean {mean / 1024:.1f} KiB; per call {args.new_tokens[0]}-{args.new_tokens[1]} "
          f"new prompt and {args.gen_tokens[0]}-{args.gen_tokens[1]} generated tokens, delta-encoded")
    rate, cap_amp, all_amp = pure_fold(records, args.repeat)
    _report("pure fold (dict state)", rate, cap_amp, f"capture events; all events {all_amp:.3f}x")
    if args.no_worker:
        return 0
    run_dir = Path(tempfile.mkdtemp(prefix="tokentrail-bench-fold-"))
    broker_dir = None
    bootstrap = args.bootstrap
    try:
        if bootstrap is None:
            from compose.rig.kafka.broker import BrokerError, start_broker

            try:
                broker_dir = run_dir / "kafka"
                bootstrap = start_broker(broker_dir).bootstrap
            except BrokerError as exc:
                print(f"faust worker: skipped, no broker ({str(exc).splitlines()[0]}); pass --bootstrap")
                return 0
        got = faust_worker(records, bootstrap, run_dir, args.rollouts)
        amp = got["state_bytes"] / sum(len(k) + len(v) for k, v in records)
        _report(f"one faust worker (RocksDB + changelog, broker {bootstrap})", got["events_s"], amp,
                f"changelog bytes, all events; {len(records):,} events in {got['seconds']:.1f} s")
    finally:
        if broker_dir is not None:
            from compose.rig.kafka.broker import stop_broker

            stop_broker(broker_dir)
    shutil.rmtree(run_dir, ignore_errors=True)  # kept, with the worker's log, when the run failed
    return 0


def _report(what: str, rate: float, amp: float, detail: str) -> None:
    print(f"{what}:")
    print(f"  throughput   {rate:>9,.0f} events/s per worker = {rate / BUDGET_EVENTS_S:.2f}x the budget "
          f"(>= {BUDGET_EVENTS_S:,.0f})")
    print(f"  state bytes  {amp:>9.3f}x the event's bytes   = {amp / BUDGET_WRITE_AMP:.2f} of the budget "
          f"(<= {BUDGET_WRITE_AMP}x; {detail})")
