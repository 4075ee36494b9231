"""Fold throughput per worker, state bytes written and held (budget, ARCHITECTURE §8: ≥ 10,000 events/s per worker and ≥ 0.8× the pure fold of the same run, ≤ 1.1×).

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
   table write). It also prints the worker's CPU per event and how busy the
   machine was meanwhile (``compose.tools.bench._fold_worker``), and with
   ``--profile FILE`` a py-spy profile of the worker (its top frames).

"Bytes written per event" is key + value bytes of the state writes over the
event's record bytes. "State per in-flight call / rollout" is the state the
fold holds once every rollout is frozen and none retired yet (key + value
bytes of its live keys, and the worker's RocksDB directory on disk), over the
calls and rollouts it holds.

The last lines are for collecting into a table (``make bench``): a ``FIGURE <name> value=<number>``
line per figure without a budget (the pure fold's rate, state bytes per in-flight call and rollout,
the worker's CPU per event, how busy the machine was), then one ``BUDGET`` line per budget:
``BUDGET <name> value=<number> budget=<op><number> [baseline=<number> ratio=<number>] ok=<true|false>``
(``fold.worker_events_s``, ``fold.worker_vs_pure``, ``fold.state_write_amp``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from compose.tools.bench.budgets import budget_line, figure_line
from schemas.kafka.security import add_kafka_config_option

if TYPE_CHECKING:
    from compose.tools.bench._fold_worker import WorkerRun

BUDGET_EVENTS_S = 10_000.0  # ARCHITECTURE §8, per worker
BUDGET_VS_PURE = 0.8  # the worker's rate over the pure fold's, same run
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
    add_kafka_config_option(parser, note="with --bootstrap only: the broker this tool starts itself is PLAINTEXT")
    parser.add_argument("--no-worker", action="store_true", help="only the pure fold")
    parser.add_argument("--profile", type=Path, metavar="FILE",
                        help="py-spy raw profile of the worker (between its first and last snapshot) to FILE; "
                             "its top frames are printed")


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


def pure_fold(records: list[tuple[bytes, bytes]], repeat: int) -> tuple[float, float, float, int]:
    """(best events/s, capture write bytes / capture event bytes, all write bytes / all event bytes,
    key + value bytes of the state held at the end)."""
    from processors.replay import MemoryState, replay

    best = 0.0
    for _ in range(repeat):
        start = time.perf_counter()
        for _step in replay(records, offsets_from=0):
            pass
        best = max(best, len(records) / (time.perf_counter() - start))
    written = event_bytes = cap_written = cap_bytes = 0
    state = MemoryState()
    for (key, value), step in zip(records, replay(records, state=state, offsets_from=0)):
        res = step.result
        w = sum(len(k) + len(v or b"") for k, v in res.writes.items())
        written, event_bytes = written + w, event_bytes + len(key) + len(value)
        if not res.emitted:  # the captures (finishes also assemble a snapshot, which is not state)
            cap_written, cap_bytes = cap_written + w, cap_bytes + len(key) + len(value)
    held = sum(len(k) + len(v) for k, v in state.items())
    return best, cap_written / cap_bytes, written / event_bytes, held


def main(args: argparse.Namespace) -> int:
    from compose.rig.stack import kafka_configs_of_args

    kafka_configs_of_args(args)  # checked before anything runs (the worker run loads it again)
    records = workload(args)
    event_bytes = sum(len(k) + len(v) for k, v in records)
    print(f"workload: {args.rollouts} rollouts x {args.calls} calls, {args.concurrent} interleaved: "
          f"{len(records):,} events, mean {event_bytes / len(records) / 1024:.1f} KiB; per call "
          f"{args.new_tokens[0]}-{args.new_tokens[1]} new prompt and {args.gen_tokens[0]}-{args.gen_tokens[1]} "
          "generated tokens, delta-encoded")
    rate, cap_amp, all_amp, held = pure_fold(records, args.repeat)
    _report("pure fold (dict state)", rate, cap_amp, f"capture events; all events {all_amp:.3f}x")
    calls = args.rollouts * args.calls
    print(f"  state held   {held / calls / 1024:>9.1f} KiB per in-flight call, {held / args.rollouts / 1024:,.0f} KiB "
          f"per in-flight {args.calls}-call rollout (key + value bytes of the live keys: {args.rollouts} rollouts "
          "frozen, none retired)")
    figures = [figure_line("fold.pure_events_s", rate),
               figure_line("fold.state_bytes_per_inflight_call", held / calls),
               figure_line("fold.state_bytes_per_inflight_rollout", held / args.rollouts)]
    budgets = [budget_line("fold.state_write_amp", all_amp, BUDGET_WRITE_AMP)]
    try:
        if not args.no_worker:
            got = _worker(args, records, event_bytes, rate)
            if got is not None:
                amp, run = got
                figures += [figure_line(name, value) for name, value in (
                    ("fold.worker_cpu_us_per_event", run.cpu_per_event_s * 1e6),
                    ("fold.machine_busy", run.machine_busy),
                    ("fold.disk_bytes_per_inflight_rollout", run.disk_bytes / args.rollouts),
                ) if not math.isnan(value)]  # NaN: not measured in this run (the reader fell behind)
                budgets = [
                    budget_line("fold.worker_events_s", run.events_s, BUDGET_EVENTS_S, op=">=", baseline=rate),
                    budget_line("fold.worker_vs_pure", run.events_s / rate, BUDGET_VS_PURE, op=">="),
                    budget_line("fold.state_write_amp", amp, BUDGET_WRITE_AMP),
                ]
    finally:
        for line in (*figures, *budgets):  # the budget lines last
            print(line)
    return 0


def _worker(args: argparse.Namespace, records: list[tuple[bytes, bytes]], event_bytes: int,
            pure_rate: float) -> tuple[float, WorkerRun] | None:
    """Run and report one real worker; (write amplification, its run), None when no broker could start."""
    from compose.tools.bench._fold_worker import run_worker
    from compose.tools.bench._pyspy import top_frames

    finishes = {key: i for i, (key, _) in enumerate(records)}  # a rollout's last event is its finish
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
                return None
        got = run_worker(records, finishes, bootstrap, run_dir, profile=args.profile, kafka_config=args.kafka_config)
        amp = got.state_bytes / event_bytes
        _report(f"one faust worker (RocksDB + changelog, broker {bootstrap})", got.events_s, amp,
                f"changelog bytes, all events; {len(records):,} events in {got.seconds:.2f} s")
        print(f"  vs pure fold {got.events_s / pure_rate:>9.2f}x the pure fold's rate of this run "
              f"(>= {BUDGET_VS_PURE}x)")
        if math.isnan(got.cpu_per_event_s):
            print("  CPU                n/a (this bench read the snapshots after the worker had folded them all, "
                  "so no span of the worker's CPU was seen; run again, or with more --rollouts)")
        else:
            print(f"  CPU          {got.cpu_per_event_s * 1e6:>9.0f} us per event (the worker's own; machine "
                  f"{got.machine_busy:.0%} busy of {os.cpu_count()} CPUs meanwhile)")
        calls = args.rollouts * args.calls
        print(f"  on disk      {got.disk_bytes / calls / 1024:>9.1f} KiB per in-flight call, "
              f"{got.disk_bytes / args.rollouts / 1024:,.0f} KiB per in-flight rollout (RocksDB SST + WAL "
              "after a clean stop)")
        if args.profile is not None:
            print(f"  profile      {args.profile} (py-spy raw); top frames:")
            for line in top_frames(args.profile.read_text(), what="the worker between its first and last snapshot"):
                print(f"    {line}")
        return amp, got
    finally:
        if broker_dir is not None:
            from compose.rig.kafka.broker import stop_broker

            stop_broker(broker_dir)
        shutil.rmtree(run_dir, ignore_errors=True)


def _report(what: str, rate: float, amp: float, detail: str) -> None:
    print(f"{what}:")
    print(f"  throughput   {rate:>9,.0f} events/s per worker = {rate / BUDGET_EVENTS_S:.2f}x the budget "
          f"(>= {BUDGET_EVENTS_S:,.0f})")
    print(f"  state bytes  {amp:>9.3f}x the event's bytes   = {amp / BUDGET_WRITE_AMP:.2f} of the budget "
          f"(<= {BUDGET_WRITE_AMP}x; {detail})")
