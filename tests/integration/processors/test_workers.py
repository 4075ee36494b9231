"""Real `tokentrail process` workers on the real broker: a clean run, kill -9, and two workers in one group.

All three runs fold the same rollout-events log (random agent rollouts with
forks, retries, cold calls, duplicates, conflicts, late writes, retirements,
a 200-call / 128k-token rollout, and undecodable, newer-schema and mis-keyed
records) on topics of their own. The clean run must emit exactly the snapshots
the pure fold computes; the others must emit, per rollout, the same distinct
snapshots as the clean run, byte for byte, and the same last one (a snapshot
may legitimately be emitted more than once: delivery is at least once).
"""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import time
import uuid

import pytest

from schemas.codec import encode_event
from schemas.kafka.admin import ensure_topics
from tests.factories import event, finished, retire
from tests.integration.processors.harness import (
    FoldWorker,
    TopicReader,
    Workload,
    all_last_seen,
    assert_same_snapshots,
    build_workload,
    describe_missing,
    emitted_by_rollout,
    group_assignment,
    log_report,
    publish,
    topic_config,
    topic_names_for,
)
from tests.unit.processors.scenarios import RolloutPlan, realistic_rollout, rollout_events

pytestmark = [pytest.mark.integration, pytest.mark.real_broker]

SEED = 20261130
BIG = "it-big-200x128k"
TIMEOUT = 120.0


@pytest.fixture(scope="module")
def workload() -> Workload:
    return make_workload()


def make_workload() -> Workload:
    rng = random.Random(SEED)
    plan = dict(root_tokens=(200, 600), new_tokens=(20, 300), gen_tokens=(20, 300))
    per_rollout = [rollout_events(rng, f"it-{i:03d}", RolloutPlan(n_calls=rng.randint(3, 12), **plan))
                   for i in range(60)]
    # Enough sampled tokens that the snapshot is over Kafka's default 1 MiB message limit.
    per_rollout.append([event(BIG, c) for c in realistic_rollout(200, 128 * 1024, generated=0.6)]
                       + [event(BIG, finished({"reward": 1.0}))])
    newer = encode_event(dataclasses.replace(event("it-newer", retire("s", 1)), schema_version=2))
    miskeyed = encode_event(event("it-000", retire("s", 1)))
    bad = {b"\x00not avro at all": (b"it-garbage", "CodecError"), newer: (b"it-newer", "SchemaVersionError"),
           miskeyed: (b"it-someone-else", "ContractError")}
    work = build_workload(per_rollout, bad, SEED)
    assert len(work.expected_distinct[BIG][-1]) > 1 << 20, "the large snapshot must exceed Kafka's default limit"
    return work


class Run:
    """Topics of their own, a snapshot reader and the workers of one test."""

    def __init__(self, bootstrap: str, run_dir, name: str) -> None:
        tag = uuid.uuid4().hex[:8]
        self.bootstrap, self.run_dir = bootstrap, run_dir
        self.prefix, self.app_id = f"{name}{tag}.", f"{name}-{tag}"
        self.topics = topic_names_for(self.prefix)
        ensure_topics(bootstrap, self.topics)
        self.snapshots = TopicReader(bootstrap, self.topics.snapshots)
        self.workers: list[FoldWorker] = []

    def worker(self, name: str, *extra_args: str) -> FoldWorker:
        w = FoldWorker(self.bootstrap, self.run_dir, name, app_id=self.app_id, prefix=self.prefix,
                       extra_args=extra_args)
        self.workers.append(w)
        return w

    def publish(self, records) -> None:
        publish(self.bootstrap, self.topics.rollout_events, records)

    def alive(self) -> None:
        for w in self.workers:
            if w.proc is not None and w.proc.poll() is not None and w.proc.returncode not in (0, -9):
                raise AssertionError(f"worker {w.name} exited with {w.proc.returncode}:\n{w.log_text()[-4000:]}")

    def wait_all(self, work: Workload) -> None:
        try:
            self.snapshots.wait(all_last_seen(work), TIMEOUT, "every rollout's last snapshot", self.alive)
        except AssertionError as exc:
            for w in self.workers:  # mode's workers log every task's stack on SIGUSR1
                if w.proc is not None and w.proc.poll() is None:
                    os.kill(w.proc.pid, signal.SIGUSR1)
            time.sleep(3)
            logs = "\n".join(f"--- {w.name} (start {w.starts})\n{log_report(w.log_text())}" for w in self.workers)
            raise AssertionError(f"{exc}\n{describe_missing(self.snapshots.records, work)}\n{logs}") from None

    def finish(self) -> dict[str, list[bytes]]:
        for w in self.workers:
            assert w.stop() == 0, f"worker {w.name} did not stop cleanly:\n{w.log_text()[-3000:]}"
        self.snapshots.poll(1.0)  # anything emitted while stopping
        self.snapshots.close()
        return emitted_by_rollout(self.snapshots.records)

    def close(self) -> None:
        for w in self.workers:
            if w.proc is not None and w.proc.poll() is None:
                w.kill9()
        self.snapshots.close()


@pytest.fixture(scope="module")
def clean(kafka_bootstrap, tmp_path_factory, workload):
    """One worker, never interrupted: the reference the other runs are compared with."""
    run = Run(kafka_bootstrap, tmp_path_factory.mktemp("clean"), "clean")
    try:
        run.worker("w").start().wait_for("Worker ready")
        run.publish(workload.records)
        run.wait_all(workload)
        deadletters = TopicReader(kafka_bootstrap, run.topics.deadletter)
        expected_bad = set(workload.bad)
        deadletters.wait(lambda recs: expected_bad <= {r.value for r in recs}, TIMEOUT, "the dead letters")
        deadletters.close()
        emitted = run.finish()
        return emitted, deadletters.records, run
    finally:
        run.close()


def test_a_clean_worker_emits_exactly_what_the_pure_fold_computes(clean, workload):
    emitted, _, _ = clean
    assert_same_snapshots(emitted, workload)
    assert max(len(s) for s in emitted[BIG]) > 1 << 20  # through Faust's producer and the topic's limit


def test_bad_records_go_to_the_dead_letter_topic_with_their_reason_and_the_stream_goes_on(clean, workload):
    _, deadletters, _ = clean
    reasons = {r.value: r.headers["tokentrail-reason"].decode() for r in deadletters}
    for value, reason in workload.bad.items():
        assert reasons[value] == reason
        source = next(r for r in deadletters if r.value == value).headers["tokentrail-source"].decode()
        assert source.startswith(workload_topic(clean)) and source.count("/") == 2
    assert "write_after_retire" in reasons.values(), "late writers of retired attempts are reported"


def test_the_changelog_is_compacted_and_accepts_large_values(clean, kafka_bootstrap):
    _, _, run = clean
    config = topic_config(kafka_bootstrap, f"{run.app_id}-rollout-state-changelog")
    assert config["cleanup.policy"] == "compact"
    assert int(config["max.message.bytes"]) >= 16 << 20


def workload_topic(clean) -> str:
    return clean[2].topics.rollout_events


def test_kill_9_mid_run_then_restart_recovers_from_the_changelog_with_identical_snapshots(
        kafka_bootstrap, tmp_path, workload, clean):
    run = Run(kafka_bootstrap, tmp_path, "kill")
    try:
        worker = run.worker("w").start()
        worker.wait_for("Worker ready")
        first, second = workload.split(0.5)
        run.publish(first)
        run.snapshots.wait(lambda recs: len(recs) >= 10, TIMEOUT, "snapshots of the first half", run.alive)
        run.publish(second)
        seen = len(run.snapshots.records)
        run.snapshots.wait(lambda recs: len(recs) > seen, TIMEOUT, "a snapshot of the second half", run.alive)
        worker.kill9()  # mid-run: offsets, changelog and RocksDB are all somewhere in flight
        worker.start()
        worker.wait_for("did not stop cleanly")  # the local tables are discarded ...
        worker.wait_for("Worker ready")  # ... and recovered from the changelog
        run.wait_all(workload)
        emitted = run.finish()
    finally:
        run.close()
    assert_same_as_clean(emitted, workload, clean)


def test_a_worker_whose_offset_guard_seeks_every_millisecond_still_emits_every_snapshot(
        kafka_bootstrap, tmp_path, workload, clean):
    """Seeks from the event loop's thread once stalled the consumer thread's fetcher for good (seen in CI):
    here the guard re-seeks and re-checks tails a thousand times a second, and the run must still finish."""
    run = Run(kafka_bootstrap, tmp_path, "seeks")
    try:
        worker = run.worker("w", "--hole-check-interval", "0.001").start()
        worker.wait_for("Worker ready")
        run.publish(workload.records)
        run.wait_all(workload)
        assert "rewinding" in worker.log_text(), "the guard did seek"
        emitted = run.finish()
    finally:
        run.close()
    assert_same_as_clean(emitted, workload, clean)


def test_two_workers_split_the_partitions_and_one_leaving_changes_no_snapshot(
        kafka_bootstrap, tmp_path, workload, clean):
    run = Run(kafka_bootstrap, tmp_path, "pair")
    topic = run.topics.rollout_events
    try:
        one, two = run.worker("one").start(), run.worker("two").start()
        one.wait_for("Worker ready")
        two.wait_for("Worker ready")
        _wait(lambda: sorted(map(len, group_assignment(kafka_bootstrap, run.app_id, topic))) == [2, 2],
              "two members with two partitions each", run.alive)
        first, second = workload.split(0.5)
        run.publish(first)
        part = build_workload_prefix(workload, first)
        run.snapshots.wait(lambda recs: part <= {r.value for r in recs}, TIMEOUT, "the first half's snapshots",
                           run.alive)
        assert two.stop() == 0  # leaves the group: its partitions move to `one`, state via the changelog
        _wait(lambda: [len(p) for p in group_assignment(kafka_bootstrap, run.app_id, topic)] == [4],
              "one member with all four partitions", run.alive)
        run.publish(second)
        run.wait_all(workload)
        emitted = run.finish()
    finally:
        run.close()
    assert_same_as_clean(emitted, workload, clean)


def build_workload_prefix(work: Workload, records) -> set[bytes]:
    """The distinct snapshots a clean run emits for the first ``len(records)`` records."""
    from processors.replay import replay

    return {s.data for step in replay(records) for s in step.result.emitted}


def _wait(condition, what: str, alive, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if condition():
                return
        except Exception:  # the group may be rebalancing; its description is not ready
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        alive()
        time.sleep(0.5)


def assert_same_as_clean(emitted, workload: Workload, clean) -> None:
    """The pure fold's snapshots, and per rollout the clean run's distinct snapshots and its last one."""
    assert_same_snapshots(emitted, workload)
    reference, _, _ = clean
    for rid, snaps in reference.items():
        assert set(emitted[rid]) == set(snaps) and emitted[rid][-1] == snaps[-1], rid
