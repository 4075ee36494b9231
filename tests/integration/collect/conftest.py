"""The collect suite's rig: a stack whose consumer delivers to the rebuilt topic, and the command run as a process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path

import pytest

from compose.collect.taskset import SHIPPED
from compose.rig.stack import LocalStack

SECRET = "collect-rollout-secret-0123456789abcdef"


@pytest.fixture(scope="module")
def collect_stack(kafka_bootstrap, tmp_path_factory):
    """Reference engine (long context for the CLIs' prompts), interceptor with rollout tokens, Kafka sink."""
    tag = uuid.uuid4().hex[:8]
    with LocalStack(kafka_bootstrap, tmp_path_factory.mktemp("collect"), topic_prefix=f"col{tag}.",
                    processor_id=f"col{tag}", policy_args=("--max-model-len", "262144"), rollout_secret=SECRET,
                    sink="kafka") as running:
        yield running


def write_tasks(path: Path, n: int, *, prefix: str | None = None) -> Path:
    """The first ``n`` tasks of the shipped set (only those of one kind when ``prefix``)."""
    rows = [json.loads(line) for line in SHIPPED.read_text().splitlines() if line.strip()]
    if prefix is not None:
        rows = [r for r in rows if r["id"].startswith(prefix)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows[:n]))
    return path


def collect_argv(stack: LocalStack, tasks: Path, out: Path, harness: str, *extra: str) -> list[str]:
    secret = out.with_name("secret")
    secret.write_text(SECRET)
    return [sys.executable, "-m", "compose.cli", "collect", "--tasks", str(tasks), "--harness", harness,
            "--out", str(out), "--bootstrap", stack.bootstrap, "--interceptor-url", stack.interceptor_url,
            "--topic-prefix", stack.topic_prefix, "--rollout-secret-file", str(secret), "--no-progress", *extra]


def run_collect(argv: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def rebuilt_deliveries(stack: LocalStack) -> dict[str, set[tuple[str, int]]]:
    """rollout id -> the distinct (snapshot_id, version) identities delivered on the rebuilt topic."""
    from schemas.codec import decode_rebuilt
    from schemas.kafka.scan import TopicReader

    out: dict[str, set[tuple[str, int]]] = defaultdict(set)
    reader = TopicReader(stack.bootstrap)
    try:
        for msg in reader.read_topic(stack.topics.rebuilt):
            record = decode_rebuilt(msg.value())
            out[record.rollout_id].add((record.snapshot_id, record.version))
    finally:
        reader.close()
    return out


def processes_under(root: Path) -> list[int]:
    """Pids whose working directory is inside ``root`` (a harness CLI or a tool it started)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cwd = os.readlink(f"/proc/{entry}/cwd")
            except OSError:
                continue
            if cwd.startswith(str(root)):
                found.append(int(entry))
    return found


def wait_for(predicate, timeout: float, what: str, interval: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


def kill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
