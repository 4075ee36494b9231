"""``tokentrail demo-trl``: TRL's ``GRPOTrainer`` trained on rollouts collected through tokentrail, on CPU.

Brings up a Kafka broker, the engine (the real vLLM CPU engine on the tiny ``crafted`` checkpoint by
default, the reference server with ``--engine reference``), the interceptor, the fold processor and
a consumer delivering to the rebuilt topic (``compose.rig.stack.LocalStack``, ``sink="kafka"``).
The trainer (``trainer/grpo.py``, a child in the engine's environment: torch and TRL live there) runs
``trl.GRPOTrainer(rollout_func=make_rollout_func(...), reward_funcs=[tokentrail_reward])`` on the
same tiny checkpoint: per entry of each batch one session of ``consumers.trl_source`` runs the SDK
agent (``compose.harnesses.sdk``: a weather tool, several turns) against the interceptor under its
own rollout id, finishes it with its reward and waits for its delivered record, which the plugin
turns into TRL's row.

The reward is the share of lowercase ASCII letters in the agent's final answer: text alone, so any
engine's answers get one (a task verifier would score every answer of a tiny model 0, and equal
rewards give GRPO no advantage). On the ``crafted`` checkpoint every rollout of a prompt is the
same (its margins are > 40 nats), and the ``random`` one's answers had no lowercase text (reward 0
every time), so on vLLM rewards tie and advantages are 0: the demo shows the plumbing; the
reference engine (a seed per rollout) samples different answers, and there the loss moves.

Printed per step: each rollout (id, mask_sample and why, reward, TRL's advantage, tokens trained),
checked against the record the demo reads back from the rebuilt topic (``report.row_mismatches``),
then the rewards, the masked fraction and TRL's loss (its log, through a ``TrainerCallback``).
Weights are not pushed back to the engine: the engine samples with the initial weights all run
long (``make demo-async`` shows weight pushes).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from compose.tools.trl_demo.report import (
    TASKS,
    TRL_DEMO_DIR,
    DemoOptions,
    DemoResult,
    RowReport,
    StepReport,
    row_mismatches,
)
from schemas.errors import TokentrailError

__all__ = ["configure", "main", "run_demo"]

HERE = Path(__file__).resolve().parent
EVENT = "tokentrail-demo-trl "  # the trainer child's event lines start so (trainer/grpo.py)
OVERLAY = Path(".tokentrail") / "trl-overlay"  # fastmcp and its mcp < 2 for OpenEnv (Makefile `trl`)


def configure(parser: argparse.ArgumentParser) -> None:
    d = DemoOptions()
    parser.add_argument("--steps", type=int, default=d.steps, help="GRPO steps, one group of rollouts each")
    parser.add_argument("--group-size", type=int, default=d.group_size, help="rollouts per prompt (num_generations)")
    parser.add_argument("--engine", choices=("reference", "vllm"), default=None,
                        help="the engine (default: vllm where .venv-vllm exists, else reference)")
    parser.add_argument("--variant", choices=("crafted", "random"), default=d.variant,
                        help="the tiny checkpoint TRL trains (and vLLM serves)")
    parser.add_argument("--lr", type=float, default=d.lr, help="TRL's learning rate")
    parser.add_argument("--bootstrap", help="use this (PLAINTEXT) broker instead of starting one")
    parser.add_argument("--keep", action="store_true", help="leave the run's logs in place")


def main(args: argparse.Namespace) -> int:
    from compose.engines.vllm_rig.engine import unavailable_reason
    from compose.rig.kafka.broker import fresh_broker, stop_broker

    engine = args.engine or ("reference" if unavailable_reason() else "vllm")
    try:
        opts = DemoOptions(steps=args.steps, group_size=args.group_size, engine=engine, variant=args.variant,
                           lr=args.lr)
    except ValueError as exc:
        print(f"tokentrail demo-trl: {exc}")
        return 2
    run_dir = Path(tempfile.mkdtemp(prefix="tokentrail-demo-trl-"))
    broker_dir = None
    started = time.monotonic()
    try:
        bootstrap = args.bootstrap
        if bootstrap is None:
            broker_dir = (TRL_DEMO_DIR / "kafka").resolve()
            bootstrap = fresh_broker(broker_dir, say=lambda line: print(line, flush=True)).bootstrap
        result = run_demo(bootstrap, run_dir, opts)
        print(f"\ndone in {time.monotonic() - started:.0f} s" + (f"; logs: {run_dir}" if args.keep else ""))
        return 0 if result.consistent and len(result.steps) == opts.steps else 1
    except TokentrailError as exc:  # broker, engine, stack, the trainer, the deadline
        print(f"tokentrail demo-trl: {exc}")
        return 1
    finally:
        gc.collect()  # Kafka clients left in reference cycles go before their broker (no librdkafka noise)
        if broker_dir is not None:
            stop_broker(broker_dir)
        if not args.keep:
            shutil.rmtree(run_dir, ignore_errors=True)


class TrainerError(TokentrailError, RuntimeError):
    """The trainer child failed or went silent past the deadline; the message says which, with its log."""


class TrainerProcess:
    """``trainer/grpo.py`` in the engine's environment; its stdout events are read by a thread into a queue."""

    def __init__(self, config: dict[str, Any], log: Path, control_token: str) -> None:
        from compose.engines.vllm_rig.engine import ROOT, vllm_python

        self._log = open(log, "wb")
        self.log = log
        env = {**os.environ, "PYTHONPATH": f"{ROOT / OVERLAY}{os.pathsep}{ROOT}", "TOKENIZERS_PARALLELISM": "false",
               "TOKENTRAIL_CONTROL_TOKEN": control_token, "TRL_EXPERIMENTAL_SILENCE": "1", "HF_HUB_OFFLINE": "1",
               "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([str(vllm_python()), "-u", str(HERE / "trainer" / "grpo.py"), json.dumps(config)],
                                     cwd=ROOT, text=True, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log)
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(EVENT):  # TRL prints its own lines (its logs as dicts) on stdout too
                self.events.put(json.loads(line[len(EVENT):]))
        self.events.put(None)

    def next(self, deadline: float) -> dict[str, Any]:
        try:
            event = self.events.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise TrainerError(f"the trainer said nothing before the deadline; its log: {self.tail()}") from None
        if event is None:
            self.proc.wait(10)
            raise TrainerError(f"the trainer exited with {self.proc.returncode}: {self.tail()}")
        if event["event"] == "error":
            raise TrainerError(f"the trainer failed: {event['error']}; its log: {self.tail()}")
        return event

    def tail(self) -> str:
        self._log.flush()
        return self.log.read_text(errors="replace")[-3000:]

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()  # a trainer still waiting for the stack exits on EOF
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def _say(line: str) -> None:
    print(line, flush=True)


def run_demo(bootstrap: str, run_dir: Path, opts: DemoOptions, say: Callable[[str], None] = _say) -> DemoResult:
    """Run the demo against the (PLAINTEXT) broker at ``bootstrap``, logs under ``run_dir``; everything it
    starts is stopped. Raises `TrainerError` (or the stack's errors) when it cannot finish."""
    from compose.engines.vllm_rig.engine import SERVED_NAME, VllmEngine, checkpoint
    from compose.rig.stack import LocalStack

    deadline = time.monotonic() + opts.deadline_s
    tag = time.strftime("%H%M%S")
    model = checkpoint(opts.variant)  # built on first use, cached under .tokentrail/checkpoints
    stack = LocalStack(bootstrap, run_dir / "stack", topic_prefix=f"dt{tag}.", processor_id=f"dt{tag}",
                       sink="kafka", intercept_args=("--prefix-supply",) if opts.variant == "random" else ())
    config = {"checkpoint": str(model), "steps": opts.steps, "group_size": opts.group_size, "prompts": list(TASKS),
              "lr": opts.lr, "seed": opts.seed, "max_completion_length": opts.max_completion_length,
              "output_dir": str(run_dir / "trl")}
    trainer = TrainerProcess(config, run_dir / "trainer.log", stack.control_token)  # TRL loads while the stack starts
    # The random checkpoint seldom samples an end token and the agent sends no max_tokens: cap its answers.
    cap = ("--override-generation-config", '{"max_new_tokens": 48}') if opts.variant == "random" else ()
    engine = VllmEngine(run_dir / "vllm", variant=opts.variant, extra_args=cap) if opts.engine == "vllm" else None
    steps: list[StepReport] = []
    try:
        if engine is not None:
            t0 = time.monotonic()
            stack.upstream_url = engine.start().url
            say(f"vllm      {engine.url} (real vLLM CPU, tiny {opts.variant} checkpoint, up in "
                f"{time.monotonic() - t0:.0f} s)")
        with stack:
            say(f"stack     engine {stack.upstream_kind} {stack.policy_url}, interceptor {stack.interceptor_url}, "
                f"processor and consumer (sink: topic {stack.topics.rebuilt})")
            trainer.next(deadline)  # ready
            say(f"trainer   trl.GRPOTrainer on {model} (pid {trainer.proc.pid}): {opts.steps} steps, "
                f"num_generations={opts.group_size}, reward = lowercase share of the final answer\n")
            trainer.send({"interceptor_url": stack.interceptor_url, "bootstrap": bootstrap,
                          "topic": stack.topics.rebuilt, "rollout_prefix": f"dt{tag}",
                          "model": SERVED_NAME if engine is not None else "tokentrail-policy",
                          "tool_calls": opts.tool_calls})
            steps = _follow(trainer, bootstrap, stack.topics.rebuilt, deadline, say)
    finally:
        trainer.close()
        if engine is not None:
            engine.stop()
    result = DemoResult(steps=steps, engine=opts.engine, topic=stack.topics.rebuilt)
    rows = result.rows
    say(f"\n{len(rows)} rollouts in {len(steps)} TRL steps, {sum(r.mask_sample for r in rows)} masked; "
        f"{'every row TRL trained on is its delivered record' if result.consistent else 'ROWS DIFFER from records'}"
        "; weights were not pushed back to the engine (make demo-async shows pushes)")
    return result


def _follow(trainer: TrainerProcess, bootstrap: str, topic: str, deadline: float,
            say: Callable[[str], None]) -> list[StepReport]:
    """Read the trainer's events until it is done: check and print each batch, then its step's log."""
    from consumers.trl_source.records import RebuiltTopic

    records = RebuiltTopic(bootstrap, topic, poll_s=0.2)
    since_ms = int(time.time() * 1000) - 60_000
    steps: list[StepReport] = []
    while True:
        event = trainer.next(deadline)
        if event["event"] == "done":
            return steps
        if event["event"] == "batch":
            rows = []
            for row in event["rows"]:
                record = records.wait(row["rollout_id"], since_ms, deadline)
                rows.append(RowReport(
                    rollout_id=row["rollout_id"], mask_sample=record.mask_sample,
                    reasons=[f"{m.code}: {m.detail}" if m.detail else m.code for m in record.mask_reasons],
                    reward=row["reward"], advantage=row["advantage"], trained_tokens=sum(row["env_mask"] or []),
                    tokens=len(row["prompt_ids"]) + len(row["completion_ids"]), calls=record.metrics.n_calls,
                    mismatches=row_mismatches(row, record)))
            steps.append(StepReport(step=event["step"], rows=rows, batch=event["rows"]))
            say(f"step {event['step']}: {len(rows)} rollouts delivered and handed to TRL")
            for r in rows:
                say(r.line())
        elif event["event"] == "log" and "loss" in event["logs"] and steps:
            steps[-1].logs = event["logs"]
            say(steps[-1].line() + "\n")
