"""Where a rebuild's and the consumer's time goes: the profiles of ``docs/perf/consumer.md``.

A private helper of ``compose.tools.bench.rebuild`` (the leading underscore keeps it
out of the ``tokentrail bench`` list), run as a module:

``python -m compose.tools.bench._rebuild_profile rebuild MODE``
    cProfile over ``--repeat`` rebuilds (after one untimed warm-up) of the rebuild
    bench's rollout of ``--calls`` / ``--tokens`` (``compose.tools.bench.rebuild``):
    ``compact`` (no projection), ``projection`` (NeMo RL's projection too), ``tree``
    (``delivery_mode="traces"`` on ``_rebuild_tree``'s tree, no projection). Prints the
    top ``--top`` frames by own time.
``python -m compose.tools.bench._rebuild_profile consumer``
    the consumer loop (``consumers.loop.RebuildConsumer``: decode, rebuild in a worker
    thread, the JSONL sink writing and fsyncing, retire, commit) over ``--rollouts``
    snapshots of that size, with in-memory Kafka clients (no broker: the loop's own
    costs, not the network's). The sink writes under ``--dir`` (default a temporary
    folder on /dev/shm when there is one) and the file is removed. cProfile sees one
    thread and the rebuild runs in a worker thread, so profile this mode with py-spy:
    ``py-spy record -r 250 -f raw -o FILE -- python -m compose.tools.bench._rebuild_profile consumer``
``python -m compose.tools.bench._rebuild_profile top FILE [--within TEXT ...]``
    the top ``--top`` frames of py-spy's raw output by own samples, with their own and
    inclusive shares, over the stacks that hold one of the ``--within`` frames and are
    not idle (py-spy counts a pool thread waiting for work as running). For the
    consumer: ``--within Runner.run --within _WorkItem.run`` (the event loop and its
    worker threads: the setup left out).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import dataclasses
import os
import pstats
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from typing import Any


def profile_rebuild(mode: str, n_calls: int, n_tokens: int, repeat: int, top: int) -> None:
    from compose.tools.bench._rebuild_tree import synth_tree_snapshot
    from compose.tools.bench.rebuild import synth_snapshot
    from consumers.rebuild import RebuildRules, rebuild

    if mode == "tree":
        snapshot = synth_tree_snapshot(n_calls, n_tokens)
        rules = RebuildRules(delivery_mode="traces", project_response=False)
    else:
        snapshot = synth_snapshot(n_calls, n_tokens)
        rules = RebuildRules(project_response=mode == "projection")
    out = rebuild(snapshot, rules)  # warm-up, and a check that the input rebuilds unmasked
    if out.mask_sample:
        raise SystemExit(f"profile input is wrong: {out.mask_reasons}")
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(repeat):
        rebuild(snapshot, rules)
    profiler.disable()
    print(f"rebuild {mode}: {n_calls} calls / {n_tokens} tokens, {repeat} rebuilds")
    pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(top)


class _Message:
    """What the loop reads of a confluent-kafka message."""

    def __init__(self, value: bytes, offset: int, key: bytes) -> None:
        self._value, self._offset, self._key = value, offset, key

    def value(self) -> bytes:
        return self._value

    def key(self) -> bytes:
        return self._key

    def offset(self) -> int:
        return self._offset

    def partition(self) -> int:
        return 0

    def topic(self) -> str:
        return "tokentrail.snapshots"

    def error(self) -> None:
        return None

    def timestamp(self) -> tuple[int, int]:
        return 1, 1_700_000_000_000


class _Consumer:
    def __init__(self, messages: list[_Message]) -> None:
        self.messages = messages

    def poll(self, timeout: float) -> _Message | None:
        if self.messages:
            return self.messages.pop(0)
        threading.Event().wait(min(timeout, 0.01))
        return None

    def commit(self, offsets: list[Any], asynchronous: bool = False) -> None:
        pass

    def close(self) -> None:
        pass


class _Producer:
    """Acknowledges every record at the next flush or poll."""

    def __init__(self) -> None:
        self._callbacks: list[Any] = []

    def produce(self, topic: str, key: bytes | None = None, value: bytes = b"", headers: list | None = None,
                on_delivery: Any = None) -> None:
        self._callbacks.append(on_delivery)

    def flush(self, timeout: float = 0) -> int:
        self.poll(0)
        return 0

    def poll(self, timeout: float = 0) -> int:
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(None, None)
        return len(callbacks)


def run_consumer(rollouts: int, n_calls: int, n_tokens: int, folder: str | None, response: bool) -> None:
    from compose.tools.bench.rebuild import synth_snapshot
    from consumers.loop import RebuildConsumer
    from consumers.settings import ConsumerSettings
    from consumers.sinks.plugin import JsonlSink
    from schemas.codec import encode_snapshot

    base = synth_snapshot(n_calls, n_tokens)
    blobs = []
    for i in range(rollouts):  # one fold, re-encoded under distinct ids: the sink is idempotent by identity
        blobs.append(encode_snapshot(dataclasses.replace(base, rollout_id=f"bench-{i}", snapshot_id=f"snap-{i}")))
    messages = [_Message(blob, offset, f"bench-{offset}".encode()) for offset, blob in enumerate(blobs)]
    parent = folder or ("/dev/shm" if os.path.isdir("/dev/shm") else None)
    workdir = tempfile.mkdtemp(prefix="tokentrail-profile-", dir=parent)
    try:
        sink = JsonlSink(os.path.join(workdir, "rebuilt.jsonl"), include_response=response)
        settings = ConsumerSettings(bootstrap="127.0.0.1:9", poll_timeout_s=0.01, shutdown_grace_s=5.0)
        consumer = RebuildConsumer(settings, sink, kafka_consumer=_Consumer(messages), kafka_producer=_Producer())
        start = time.perf_counter()
        stats = asyncio.run(_drive(consumer, rollouts))
        elapsed = time.perf_counter() - start
        size = os.path.getsize(os.path.join(workdir, "rebuilt.jsonl"))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"consumer: {stats.delivered} rollouts of {n_calls} calls / {n_tokens} tokens "
          f"({'with' if response else 'without'} the projection, {size / rollouts / 1e6:.1f} MB each) "
          f"in {elapsed:.2f} s: {elapsed * 1000 / rollouts:.1f} ms per rollout; masked {stats.masked}")


async def _drive(consumer: Any, rollouts: int) -> Any:
    try:
        return await consumer.run(max_rollouts=rollouts)
    finally:
        await consumer.close()


# Leaf frames where a thread waits, though py-spy samples it as running.
_IDLE = ("_worker (concurrent/futures/thread.py:81)", "EpollSelector.select (selectors.py:")


def top_frames(path: str, top: int, within: list[str]) -> None:
    """py-spy's raw (folded) stacks: ``frame;frame;... count`` per line."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = idle = 0
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack or not count.isdigit() or (within and not any(w in stack for w in within)):
                continue
            n = int(count)
            frames = stack.split(";")
            if frames[-1].startswith(_IDLE):
                idle += n
                continue
            total += n
            own[frames[-1]] += n
            for frame in set(frames):
                inclusive[frame] += n
    print(f"{total} samples ({idle} idle left out); top {top} frames by own samples (own %, inclusive %)")
    for frame, n in own.most_common(top):
        print(f"{100 * n / total:6.1f} {100 * inclusive[frame] / total:6.1f}  {frame}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m compose.tools.bench._rebuild_profile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    rb = sub.add_parser("rebuild")
    rb.add_argument("mode", choices=("compact", "projection", "tree"))
    rb.add_argument("--repeat", type=int, default=20)
    cons = sub.add_parser("consumer")
    cons.add_argument("--rollouts", type=int, default=6)
    cons.add_argument("--dir", help="where the JSONL sink writes (default: a temporary folder, on /dev/shm if any)")
    cons.add_argument("--no-response", dest="response", action="store_false", help="the sink without the projection")
    for p in (rb, cons):
        p.add_argument("--calls", type=int, default=200)
        p.add_argument("--tokens", type=int, default=131_072)
    tp = sub.add_parser("top")
    tp.add_argument("file")
    tp.add_argument("--within", action="append", default=[], help="keep only stacks holding this frame text")
    for p in (rb, tp):
        p.add_argument("--top", type=int, default=20)
    args = parser.parse_args(argv)
    if args.what == "rebuild":
        profile_rebuild(args.mode, args.calls, args.tokens, args.repeat, args.top)
    elif args.what == "consumer":
        run_consumer(args.rollouts, args.calls, args.tokens, args.dir, args.response)
    else:
        top_frames(args.file, args.top, args.within)
    return 0


if __name__ == "__main__":
    sys.exit(main())
