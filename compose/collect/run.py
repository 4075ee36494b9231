"""The collect loop: every (task, sample) to a verified, finished, delivered rollout or a failure row.

For each pending rollout, at most ``concurrency`` at once:

1. journal the attempt (its own rollout id), make a fresh working directory holding the
   task's files, run the harness against the attempt's capture URL;
2. a failure is journaled and written to the failures file; a non-terminal one is tried
   again (a new attempt, a new rollout id) until ``max_attempts`` attempts, counted over
   re-runs; then (or at once, for a terminal one) a reward-0 sentinel row stands;
3. an answer is verified (a verifier that raises is a terminal failure, never a crash);
   the RolloutFinished payload (reward, verifier output, group, final text and response
   id, attempt) is journaled, then published;
4. the rebuilt record is awaited on the rebuilt topic, its JSON written to the
   trajectories directory, and the result row appended.

A re-run resumes: standing rows are kept, a journaled finish is published again (the same
payload: the same snapshot identity) and awaited, never re-run; everything else starts a
new attempt. Ctrl-C (SIGINT or SIGTERM) stops the run cleanly: no new attempt starts, the
harnesses in flight are killed, what was durable stays so, and the summary is printed.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from compose.collect.harnesses import Attempt, Harness
from compose.collect.journal import AttemptEntry, Journal, append_line, job_key, rollout_ids
from compose.collect.local import StackAddress
from compose.collect.outcome import Failure, FailureClass, HarnessOutcome
from compose.collect.records import RebuiltRecords
from compose.collect.results import ResultsFile, failure_row, success_row
from compose.collect.settings import CollectSettings
from compose.collect.summary import Summary, summarize
from compose.collect.tasks import Task
from compose.collect.verify import VerifierError, verify
from schemas.errors import TokentrailError

__all__ = ["Collector", "Finisher", "RecordSource", "KafkaFinisher"]


class Finisher(Protocol):
    """Publishes one RolloutFinished; returns once it is durable, else raises a TokentrailError."""

    async def finish(self, rollout_id: str, payload: dict[str, Any]) -> None: ...

    async def close(self) -> None: ...


class RecordSource(Protocol):
    """Rebuilt records by rollout id (``compose.collect.records.RebuiltRecords``)."""

    async def wait(self, rollout_id: str, timeout_s: float) -> dict[str, Any] | None: ...

    def close(self) -> None: ...


class KafkaFinisher:
    """RolloutFinished to the rollout-events topic, acknowledged by Kafka (``producers.finish``)."""

    def __init__(self, stack: StackAddress) -> None:
        from schemas.kafka.bridge import AckedProducer
        from schemas.kafka.config import QUIET_LOGGER, producer_config

        self.stack = stack
        # librdkafka's own log lines (a broker going away at the end of a --local run) stay out of the
        # run's output; a publish that fails raises PublishFailed, which the row reports.
        self.publisher = AckedProducer(producer_config(stack.bootstrap, extra={"logger": QUIET_LOGGER},
                                                       security=stack.kafka),
                                       name="tokentrail-collect-finish")

    async def finish(self, rollout_id: str, payload: dict[str, Any]) -> None:
        from producers.finish import finish_rollout

        await finish_rollout(self.stack.bootstrap, rollout_id, payload["result"],
                             final_response_id=payload.get("final_response_id"), final_text=payload.get("final_text"),
                             attempt=payload["attempt"], topic=self.stack.topics.rollout_events,
                             publisher=self.publisher)

    async def close(self) -> None:
        await self.publisher.close()


@dataclass(frozen=True)
class _Job:
    task: Task
    sample: int

    @property
    def key(self) -> str:
        return job_key(self.task.id, self.sample)


class Collector:
    def __init__(self, settings: CollectSettings, tasks: list[Task], verifiers: dict[str, Callable], harness: Harness,
                 stack: StackAddress, journal: Journal, *, finisher: Finisher | None = None,
                 records: RecordSource | None = None) -> None:
        """``finisher`` and ``records`` default to Kafka (the stack's topics); ``records`` only with wait_records."""
        self.s, self.tasks, self.verifiers, self.harness, self.stack = settings, tasks, verifiers, harness, stack
        self.journal = journal
        self.run_id = journal.header.run_id
        self.results = ResultsFile(settings.out)
        self.finisher = finisher
        self.records = records
        self.written = 0
        self.stopping = False
        self._bar: Any = None  # the tqdm bar while running (tqdm ships no types)
        self._totals: tuple[int, float, int, int] = (0, 0.0, 0, 0)  # rows, reward sum, masked, failed

    # -- the run -------------------------------------------------------------------------
    def jobs(self) -> list[_Job]:
        return [_Job(task, sample) for task in self.tasks for sample in range(self.s.samples)]

    def _retried(self, job: _Job) -> bool:
        """A standing row this run replaces: a non-terminal failure with attempts left, or a delivery to redo."""
        row = self.results.rows.get(job.key)
        if row is None or not row.get("failure_class"):
            return False
        if row["failure_class"] in (FailureClass.FINISH_ERROR, FailureClass.DELIVERY_TIMEOUT):
            return True
        return not row.get("terminal") and len(self.journal.attempts(job.key)) < self.s.max_attempts

    async def run(self) -> Summary:
        started = time.monotonic()
        jobs = self.jobs()
        self.results.compact([j.key for j in jobs if self._retried(j)])
        pending = [j for j in jobs if j.key not in self.results.rows]
        for row in self.results.rows.values():
            self._tally(row)
        if self.finisher is None:
            self.finisher = KafkaFinisher(self.stack)
        if self.s.wait_records and self.records is None:
            # From the run's first start (a minute's clock slack): a resumed run finds what was delivered before.
            self.records = RebuiltRecords(self.stack.bootstrap, self.stack.topics.rebuilt,
                                          from_ms=self.journal.header.started_ms - 60_000, security=self.stack.kafka)
        elif not self.s.wait_records:
            self.records = None
        self._bar = _progress(len(jobs), len(jobs) - len(pending), enabled=self.s.progress)
        loop = asyncio.get_running_loop()
        tasks: list[asyncio.Task] = []

        def stop() -> None:
            if not self.stopping:
                self.stopping = True
                print("\ntokentrail collect: stopping (rows written so far stand; re-run to resume)",
                      file=sys.stderr, flush=True)
                self.harness.stop_all()
                for t in tasks:
                    t.cancel()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop)
        gate = asyncio.Semaphore(self.s.concurrency)
        try:
            tasks.extend(asyncio.create_task(self._guarded(gate, job)) for job in pending)
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            self._bar.close()
            if self.records is not None:
                self.records.close()
            await self.finisher.close()
        return summarize(self.results.rows.values(), expected=len(jobs), wall_s=time.monotonic() - started,
                         written=self.written)

    async def _guarded(self, gate: asyncio.Semaphore, job: _Job) -> None:
        async with gate:
            if self.stopping:
                return
            await self._job(job)

    # -- one rollout -----------------------------------------------------------------------
    async def _job(self, job: _Job) -> None:
        prior = self.journal.attempts(job.key)
        if prior and prior[-1].finish is not None:
            await self._deliver(job, prior[-1], time.monotonic())
            return
        while True:
            n = len(self.journal.attempts(job.key))
            if n >= self.s.max_attempts:
                last = self.journal.attempts(job.key)[-1]
                final = Failure(FailureClass(last.failure["failure_class"]), last.failure["detail"]) \
                    if last.failure else Failure(FailureClass.HARNESS_CRASH, "the attempt was cut short (the "
                                                 "collector stopped) and no attempts are left")
                self._row(failure_row(final, attempts=n, **self._ids(job, last, 0.0)))
                return
            rid = rollout_ids(self.run_id, job.task.id, job.sample, n, declared=job.task.rollout_id,
                              samples=self.s.samples)
            self.journal.record_attempt(job.key, n, rid)
            entry = self.journal.attempts(job.key)[-1]
            t0 = time.monotonic()
            outcome = await self._attempt(job, entry)
            failure, payload = self._decide(job, entry, outcome)
            if failure is None:
                self.journal.record_finish(job.key, n, payload)
                await self._deliver(job, entry, t0)
                return
            self.journal.record_failure(job.key, n, {"failure_class": str(failure.failure_class),
                                                     "detail": failure.detail, "terminal": failure.terminal})
            ids = self._ids(job, entry, time.monotonic() - t0)
            append_line(self.s.failures_path, failure_row(failure, attempts=n + 1, final_text=outcome.final_text, **ids))
            if failure.terminal or n + 1 >= self.s.max_attempts:
                self._row(failure_row(failure, attempts=n + 1, final_text=outcome.final_text, **ids))
                return

    async def _attempt(self, job: _Job, entry: AttemptEntry) -> HarnessOutcome:
        workdir = self.s.work_dir / entry.rollout_id
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir(parents=True)
        for rel, text in job.task.files.items():
            (workdir / rel).parent.mkdir(parents=True, exist_ok=True)
            (workdir / rel).write_text(text)
        attempt = Attempt(job.task, entry.rollout_id, entry.attempt, workdir, self.stack.capture_root(entry.rollout_id),
                          self.stack.api_key(entry.rollout_id))
        try:
            # The harness's own deadline is the rollout timeout; this one (with a kill grace) bounds a harness
            # whose own deadline failed, so one stuck rollout never stalls the run.
            return await asyncio.wait_for(self.harness.run(attempt), self.s.rollout_timeout_s + 30)
        except TimeoutError:
            return HarnessOutcome.failed(FailureClass.TIMEOUT, f"no outcome within {self.s.rollout_timeout_s:.0f} s")
        except Exception as exc:  # a harness's bug is this rollout's failure, never the run's end
            return HarnessOutcome.failed(FailureClass.HARNESS_CRASH, f"{type(exc).__name__}: {exc}")
        finally:
            if not self.s.keep_workdirs:
                shutil.rmtree(workdir, ignore_errors=True)

    def _decide(self, job: _Job, entry: AttemptEntry, outcome: HarnessOutcome) -> tuple[Failure | None, dict]:
        if outcome.failure is not None:
            return outcome.failure, {}
        try:
            verdict = verify(job.task, outcome.final_text, custom=self.verifiers.get(job.task.verifier.target or ""))
        except VerifierError as exc:
            return Failure(FailureClass.VERIFIER_ERROR, str(exc)), {}
        result = {"reward": verdict.reward, "verifier": verdict.to_json(), "run_id": self.run_id,
                  "task_id": job.task.id, "sample": job.sample, "group_id": self._group(job),
                  "group_size": self.s.samples, "harness": self.s.harness, "attempt": entry.attempt}
        return None, {"result": result, "final_response_id": outcome.final_response_id,
                      "final_text": outcome.final_text, "attempt": entry.attempt}

    async def _deliver(self, job: _Job, entry: AttemptEntry, t0: float) -> None:
        payload = entry.finish or {}
        assert self.finisher is not None  # run() sets it
        try:
            await self.finisher.finish(entry.rollout_id, payload)
        except TokentrailError as exc:
            self._delivery_failed(job, entry, t0, Failure(FailureClass.FINISH_ERROR, str(exc)))
            return
        record = None
        if self.records is not None:
            record = await self.records.wait(entry.rollout_id, self.s.record_timeout_s)
            if record is None:
                self._delivery_failed(job, entry, t0, Failure(
                    FailureClass.DELIVERY_TIMEOUT, f"finished, but no rebuilt record on {self.stack.topics.rebuilt} "
                    f"within {self.s.record_timeout_s:.0f} s: is the consumer running with --sink kafka?"))
                return
        path = None
        if record is not None:
            self.s.trajectories_dir.mkdir(parents=True, exist_ok=True)
            target = self.s.trajectories_dir / f"{entry.rollout_id}.json"
            target.write_text(json.dumps(record, sort_keys=True))
            path = str(target)
        result = payload["result"]
        self._row(success_row(record=record, reward=result["reward"], verdict=result["verifier"],
                              final_text=payload.get("final_text"), trajectory_path=path,
                              **self._ids(job, entry, time.monotonic() - t0)))

    def _delivery_failed(self, job: _Job, entry: AttemptEntry, t0: float, failure: Failure) -> None:
        ids = self._ids(job, entry, time.monotonic() - t0)
        append_line(self.s.failures_path, failure_row(failure, attempts=entry.attempt + 1, **ids))
        self._row(failure_row(failure, attempts=entry.attempt + 1, **ids))

    # -- rows ----------------------------------------------------------------------------
    def _group(self, job: _Job) -> str:
        return f"{self.run_id}.{job.task.id}"

    def _ids(self, job: _Job, entry: AttemptEntry, wall_s: float) -> dict[str, Any]:
        return {"run_id": self.run_id, "key": job.key, "task_id": job.task.id, "sample": job.sample,
                "group_id": self._group(job), "attempt": entry.attempt, "rollout_id": entry.rollout_id,
                "harness": self.s.harness, "wall_s": wall_s}

    def _row(self, row: dict[str, Any]) -> None:
        self.results.append(row)
        self.written += 1
        self._tally(row)
        if self._bar is not None:
            n, reward, masked, failed = self._totals
            self._bar.set_postfix_str(f"reward {reward / n:.2f}, masked {masked}, failed {failed}", refresh=False)
            self._bar.update(1)

    def _tally(self, row: dict[str, Any]) -> None:
        # Running totals for the bar: a row is tallied once (a key's row is written once per run).
        n, reward, masked, failed = self._totals
        self._totals = (n + 1, reward + float(row["reward"]), masked + bool(row.get("mask_sample")),
                        failed + bool(row.get("failure_class")))


def _progress(total: int, initial: int, *, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="rollout", desc="collect", file=sys.stderr, disable=not enabled,
                dynamic_ncols=True, mininterval=0.5)
