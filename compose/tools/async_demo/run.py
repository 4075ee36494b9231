"""``tokentrail demo-async``: a closed RL loop on this machine, rollouts and training at once.

Brings up a Kafka broker, the real vLLM CPU engine on the tiny ``random`` checkpoint
(``compose.engines.vllm_rig``; dev mode for the weight routes), the interceptor (prefix supply)
and the fold processor. Harness tasks run groups of multi-turn streamed chat rollouts through
the interceptor and finish each with ``{"reward", "group_id", "group_size"}``; the trainer
reads delivered groups from ``consumers.trainer_stream.rollout_stream`` (the rebuild consumer in
this process), takes one policy-gradient step per group in PyTorch (``trainer/train_step.py``, a child
in the engine's environment: this one has no torch), pushes the new weights into the running
engine (``push_weights``, ``/pause?mode=keep`` by default, so streamed calls cross the update)
and announces each version before the engine resumes. Rollouts keep running meanwhile; at
most ``max_ahead`` groups are launched beyond the trainer's step (the off-policy bound).

Printed: per delivered rollout its version spans (label[start:end) over trajectory positions),
staleness, reward and mask; per trainer step its label, group size, loss, push mechanism and
time; at the end the engine's log-probs of a fixed prompt before the first step and after the
last. The reward is verifiable from text alone: the share of the answers' characters that are
lowercase ASCII letters, something the random model can move.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import httpx

from compose.tools.async_demo.report import ASYNC_DEMO_DIR, DemoOptions, DemoResult, StepReport, rollout_row, sample_of
from schemas.errors import TokentrailError
from schemas.kafka.security import add_kafka_config_option

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam

    from compose.engines.vllm_rig.weights import PauseMode

__all__ = ["configure", "main", "run_demo"]

HERE = Path(__file__).resolve().parent
FIXED_PROMPT = list(range(100, 132))  # scored by the engine before the first step and after the last
TASKS = ("Name a fruit.", "Describe the sea.", "Say something kind.", "List three colours.")


def configure(parser: argparse.ArgumentParser) -> None:
    d = DemoOptions()
    parser.add_argument("--steps", type=int, default=d.steps, help="trainer steps (one per delivered group)")
    parser.add_argument("--group-size", type=int, default=d.group_size, help="rollouts per group")
    parser.add_argument("--launchers", type=int, default=d.launchers, help="harness tasks launching groups at once")
    parser.add_argument("--max-ahead", type=int, default=d.max_ahead, help="groups launched beyond the trainer's step")
    parser.add_argument("--max-tokens", type=int, default=d.max_tokens, help="tokens per model call")
    parser.add_argument("--lr", type=float, default=d.lr, help="Adam learning rate")
    parser.add_argument("--pause-mode", choices=("keep", "wait", "abort"), default=d.pause_mode)
    parser.add_argument("--bootstrap", help="use this broker instead of starting one")
    add_kafka_config_option(parser, note="with --bootstrap only: the broker this demo starts itself is PLAINTEXT")
    parser.add_argument("--engine-url", help="use this running vLLM engine (dev mode, random checkpoint)")
    parser.add_argument("--keep", action="store_true", help="leave the run's logs in place")


def main(args: argparse.Namespace) -> int:
    from compose.rig.kafka.broker import fresh_broker, stop_broker
    from compose.rig.stack import kafka_configs_of_args

    try:
        kafka_configs = kafka_configs_of_args(args)  # checked before anything starts
    except TokentrailError as exc:
        print(f"tokentrail demo-async: {exc}")
        return 2
    opts = DemoOptions(steps=args.steps, group_size=args.group_size, launchers=args.launchers,
                       max_ahead=args.max_ahead, max_tokens=args.max_tokens, lr=args.lr, pause_mode=args.pause_mode)
    run_dir = Path(tempfile.mkdtemp(prefix="tokentrail-demo-async-"))
    broker_dir = None
    started = time.monotonic()
    try:
        bootstrap = args.bootstrap
        if bootstrap is None:
            broker_dir = (ASYNC_DEMO_DIR / "kafka").resolve()
            bootstrap = fresh_broker(broker_dir, say=lambda line: print(line, flush=True)).bootstrap
        result = run_demo(bootstrap, run_dir, opts, engine_url=args.engine_url, kafka_configs=kafka_configs)
        print(f"\ndone in {time.monotonic() - started:.0f} s" + (f"; logs: {run_dir}" if args.keep else ""))
        return 0 if result.weights_changed else 1
    except TokentrailError as exc:  # broker, engine, stack, weight push, trainer, the loop's deadline
        print(f"tokentrail demo-async: {exc}")
        return 1
    finally:
        gc.collect()  # Kafka clients left in reference cycles go before their broker (no librdkafka noise)
        if broker_dir is not None:
            stop_broker(broker_dir)
        if not args.keep:
            shutil.rmtree(run_dir, ignore_errors=True)


class DemoError(TokentrailError, RuntimeError):
    """The loop could not finish: a harness task failed, or the deadline passed; the message says which."""


class TrainerError(DemoError):
    """The trainer child failed; the message carries its error or its stderr."""


class TrainerProcess:
    """``trainer/train_step.py`` in the engine's environment: one JSON request per line, one reply per line.

    ``trainer/`` is a folder, not a package: the script imports torch, which only the engine's
    environment has, so nothing in tokentrail's may import it."""

    def __init__(self, log: Path) -> None:
        from compose.engines.vllm_rig.engine import ROOT, vllm_python

        self._log = open(log, "wb")
        script = HERE / "trainer" / "train_step.py"
        self.proc = subprocess.Popen([str(vllm_python()), "-u", str(script)], cwd=ROOT, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log)
        self.log = log

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(10)
            raise TrainerError(f"the trainer exited with {self.proc.returncode}: "
                               f"{self.log.read_text(errors='replace')[-2000:]}")
        reply = json.loads(line)
        if "error" in reply:
            raise TrainerError(f"the trainer refused the step: {reply['error']}")
        return reply

    def wait_ready(self) -> None:
        self._read()

    def step(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def run_demo(bootstrap: str, run_dir: Path, opts: DemoOptions, say: Callable[[str], None] = print, *,
             engine_url: str | None = None, kafka_configs: dict[str, Path] | None = None) -> DemoResult:
    """Run the loop against the broker at ``bootstrap`` (logs under ``run_dir``); everything it starts is stopped.

    ``kafka_configs``: the stack's client config files per role (``LocalStack.kafka_configs``); the
    demo's own clients (its version announcements, its trainer's stream) use the admin's and the consumer's.

    ``engine_url``: a running engine (dev mode, the ``random`` checkpoint) instead of starting
    one; the served checkpoint is pushed back into it first, so every run starts from step 0.
    """
    from compose.engines.vllm_rig.admin import set_version, weight_info
    from compose.engines.vllm_rig.engine import VllmEngine, checkpoint, score_prompt
    from compose.engines.vllm_rig.weights import push_weights
    from compose.rig.stack import LocalStack

    tag = time.strftime("%H%M%S")
    trainer = TrainerProcess(run_dir / "trainer.log")  # torch imports while the engine starts
    engine = VllmEngine(run_dir, variant="random", max_model_len=4096, env={"VLLM_SERVER_DEV_MODE": "1"})
    served = checkpoint("random")
    t0 = time.monotonic()
    try:
        if engine_url is None:
            engine_url = engine.start().url
            say(f"vllm      {engine_url} (real vLLM CPU, tiny random checkpoint, up in {time.monotonic() - t0:.0f} s)")
        else:
            push_weights(engine_url, served, "step-0")
            say(f"vllm      {engine_url} (running; the served checkpoint pushed back)")
        with LocalStack(bootstrap, run_dir, topic_prefix=f"da{tag}.", processor_id=f"da{tag}",
                        upstream_url=engine_url, intercept_args=("--prefix-supply",), with_pipeline=False,
                        kafka_configs=kafka_configs or {}) as stack:
            stack.add_processor("processor")
            trainer.wait_ready()
            say(f"intercept {stack.interceptor_url}; processor up; trainer ready (pid {trainer.proc.pid})\n")
            loop = DemoLoop(opts, stack, engine_url, trainer, run_dir, say, weights=served)
            loop.announce("step-0", 0)
            set_version(engine_url, "step-0")
            before = score_prompt(engine_url, FIXED_PROMPT)
            asyncio.run(loop.run())
            after = score_prompt(engine_url, FIXED_PROMPT)
            serving = weight_info(engine_url)
    finally:
        trainer.close()
        engine.stop()
    result = DemoResult(steps=loop.steps, rollouts=loop.rows, before=before, after=after, announced=loop.labels,
                        engine_version=serving)
    crossed = sum(r["crossed"] for r in loop.rows)
    stale = [r["staleness"] for r in loop.rows if r["staleness"] is not None]
    say(f"\n{len(loop.rows)} rollouts delivered, {sum(r['mask_sample'] for r in loop.rows)} masked, {crossed} with a "
        f"call that crossed a weight update mid-stream; staleness max {max(stale, default='-')}; "
        f"versions announced: {', '.join(loop.labels)}")
    say(f"engine log-probs of a fixed prompt (first 4 of {len(before)}):")
    say(f"  before step 1 ({loop.labels[0]}): {[round(v, 4) for v in before[:4]]}")
    say(f"  after step {len(loop.steps)} ({loop.labels[-1]}):  {[round(v, 4) for v in after[:4]]}")
    say(f"  max |change| {result.max_change:.4g}: the trainer's steps "
        f"{'changed' if result.weights_changed else 'did NOT change'} the engine's weights")
    return result


@dataclass
class DemoLoop:
    opts: DemoOptions
    stack: Any
    engine_url: str
    trainer: TrainerProcess
    run_dir: Path
    log: Callable[[str], None]
    weights: Path | None = None
    steps: list[StepReport] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    step_of: dict[str, int] = field(default_factory=dict)
    launched: int = 0
    delivered: int = 0
    rewards: dict[str, float] = field(default_factory=dict)

    def announce(self, label: str, step: int, weights: str = "label-only") -> str:
        """Publish ``label`` (the trainer's ``step``) on the versions topic, then make it current at the interceptor.

        The topic is what the consumer judges staleness by (and what interceptors follow). The
        admin route answers only once the interceptor's clock moved, so, called before
        ``push_weights`` resumes the engine, no token of the new weights can reach the
        interceptor before it knows their version: the observed spans split at the exact token
        (a topic follower polls, and could attribute the first tokens to the old version).
        """
        from schemas.kafka.announce import announce_version

        self.step_of[label] = step
        self.labels.append(label)
        announce_version(self.stack.bootstrap, label, step, topic=self.stack.topics.policy_versions, weights=weights,
                         security=self.stack.security("admin"))
        r = httpx.post(f"{self.stack.interceptor_url}/tokentrail/admin/policy-version", json={"version": label},
                       headers={"authorization": f"Bearer {self.stack.control_token}"}, timeout=30)
        r.raise_for_status()
        return "versions topic + interceptor admin route"

    async def run(self) -> None:
        from consumers.rebuild.output import to_json_dict
        from consumers.settings import ConsumerSettings
        from consumers.trainer_stream import rollout_stream

        settings = ConsumerSettings(bootstrap=self.stack.bootstrap, group_id=f"{self.stack.processor_id}-trainer",
                                    topics=self.stack.topics, project_response=False,
                                    kafka=self.stack.security("consumer"))
        self.stop = asyncio.Event()
        self.progress = asyncio.Condition()
        launchers: list[asyncio.Task[None]] = []
        async with rollout_stream(settings, group_key="group_id", group_size="group_size",
                                  group_timeout_s=120) as stream:
            self.log("versions: each model call's version spans, label[start:end) in trajectory positions; "
                     "staleness: trainer steps since the oldest version\n")
            failures: list[BaseException] = []
            try:
                async with asyncio.timeout(self.opts.deadline_s) as deadline:
                    def failed(task: asyncio.Task[None]) -> None:  # a harness failure ends the wait at once
                        error = None if task.cancelled() else task.exception()
                        if error is not None:
                            failures.append(error)
                            with suppress(RuntimeError):  # the wait is already over
                                deadline.reschedule(asyncio.get_running_loop().time())

                    launchers = [asyncio.create_task(self.launcher()) for _ in range(self.opts.launchers)]
                    for task in launchers:
                        task.add_done_callback(failed)
                    async for group in stream:
                        records = [to_json_dict(m, include_response=False) for m in group]
                        self.delivered += 1
                        for record in records:
                            row = rollout_row(record, self.rewards, self.step_of, len(self.steps))
                            self.rows.append(row)
                            self.log(row["line"])
                        if len(self.steps) < self.opts.steps:
                            await asyncio.to_thread(self.train_and_push, group.key, records)
                            async with self.progress:
                                self.progress.notify_all()
                            if len(self.steps) == self.opts.steps:
                                self.stop.set()
                                async with self.progress:
                                    self.progress.notify_all()
                                await asyncio.gather(*launchers)
                        if self.stop.is_set() and self.delivered >= self.launched:
                            stream.ack()  # the trainer owns this last group too: let the consumer commit it
                            break
            except TimeoutError:
                if failures:
                    raise DemoError(f"a harness task failed: {failures[0]!r}") from failures[0]
                raise DemoError(f"the loop did not finish within {self.opts.deadline_s:g} s: {self.launched} groups "
                                f"launched, {self.delivered} delivered, {len(self.steps)} of {self.opts.steps} "
                                f"steps taken; see the logs under {self.run_dir}") from None
            finally:
                self.stop.set()
                for task in launchers:
                    task.cancel()
                await asyncio.gather(*launchers, return_exceptions=True)

    def train_and_push(self, group_id: Any, records: list[dict[str, Any]]) -> None:
        from compose.engines.vllm_rig.weights import MECHANISM, push_weights

        step = len(self.steps) + 1
        label = f"step-{step}"
        out = self.run_dir / "weights" / label
        current = self.labels[-1]
        samples = [sample_of(r, self.rewards) for r in records]
        started = time.monotonic()
        reply = self.trainer.step({"weights_in": str(self.weights), "weights_out": str(out), "label": label,
                                   "lr": self.opts.lr, "current_label": current, "samples": samples})
        trained = time.monotonic() - started
        vias: list[str] = []
        started = time.monotonic()
        pause_mode = cast("PauseMode", self.opts.pause_mode)  # DemoOptions' pattern admits only these
        mechanism = push_weights(self.engine_url, out, label, pause_mode=pause_mode,
                                 announce=lambda lab: vias.append(self.announce(lab, step, MECHANISM)))
        pushed = time.monotonic() - started
        previous, self.weights = self.weights, out
        if previous is not None and previous.parent == out.parent:
            shutil.rmtree(previous, ignore_errors=True)  # the engine read it during the reload only
        report = StepReport(step=step, label=label, group=str(group_id), size=len(records),
                            trained_on=sum(1 for s in samples if not s["masked"]), loss=reply["loss"],
                            tokens=reply["tokens"], train_s=trained, push_s=pushed,
                            mechanism=f"{mechanism} pause={self.opts.pause_mode}", announced_via=vias[0],
                            on_policy_max_abs=reply["on_policy_max_abs"],
                            off_policy_mean_abs=reply["off_policy_mean_abs"])
        self.steps.append(report)
        self.log(report.line())

    async def launcher(self) -> None:
        """Launch groups one after another, at most ``max_ahead`` beyond the trainer's step, until stopped."""
        while not self.stop.is_set():
            async with self.progress:
                await self.progress.wait_for(lambda: self.stop.is_set()
                                             or self.launched < len(self.steps) + self.opts.max_ahead)
            if self.stop.is_set():
                return
            number = self.launched
            self.launched += 1
            gid = f"g{number}"
            task = TASKS[number % len(TASKS)]
            await asyncio.gather(*(self.rollout(gid, f"{gid}-r{m}", task) for m in range(self.opts.group_size)))

    async def rollout(self, group_id: str, rid: str, task: str) -> None:
        """Two streamed turns; the reward is computed from the text the harness saw, then it finishes."""
        import openai

        full = f"{self.stack.processor_id}-{rid}"  # unique per run: the tag is in the processor id
        client = openai.AsyncOpenAI(base_url=self.stack.capture_base_url(full),
                                    api_key="not-needed", max_retries=0, timeout=120)
        messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": task}]
        texts, response_id = [], None
        try:
            for follow_up in ("Go on.", None):
                stream = await client.chat.completions.create(
                    model="tokentrail-tiny", messages=messages, max_tokens=self.opts.max_tokens, stream=True,
                    extra_body={"chat_template_kwargs": {"enable_thinking": False}})
                parts: list[str] = []
                async for chunk in stream:
                    response_id = chunk.id
                    parts.extend(c.delta.content or "" for c in chunk.choices)
                texts.append("".join(parts))
                messages.append({"role": "assistant", "content": texts[-1]})
                if follow_up:
                    messages.append({"role": "user", "content": follow_up})
        except openai.APIError as exc:
            self.log(f"  {rid}: harness error {type(exc).__name__}: {exc}")
        finally:
            await client.close()
        text = "".join(texts)
        reward = sum(ch.islower() and ch.isascii() for ch in text) / max(len(text), 1)
        self.rewards[full] = reward
        await asyncio.to_thread(self.stack.finish, full,
                                {"reward": reward, "group_id": group_id, "group_size": self.opts.group_size},
                                final_response_id=response_id, final_text=texts[-1] if texts else None)

