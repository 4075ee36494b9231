"""A local tokentrail stack as child processes: policy server, interceptor, processor, consumer.

Used by the demo and the end-to-end tests. Every service is the real
``tokentrail`` subcommand in its own process (its own event loop, signals and
logs under ``run_dir``), talking to a real Kafka broker. ``stop()`` terminates
them in reverse order, SIGKILL after a grace period, and never leaves one behind.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from compose.topics import ensure_topics
from compose.vllm_engine.engine import score_prompt
from schemas.errors import TokentrailError
from schemas.topics import TopicNames, topic_names


class StackError(TokentrailError, RuntimeError):
    """A service did not come up; the message carries the end of its log."""


@dataclass
class Service:
    name: str
    proc: subprocess.Popen
    log: Path
    url: str | None = None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class LocalStack:
    bootstrap: str
    run_dir: Path
    topic_prefix: str = ""
    control_token: str = "tokentrail-demo-token"
    policy_args: tuple[str, ...] = ()
    policy_env: dict[str, str] = field(default_factory=dict)
    intercept_args: tuple[str, ...] = ()
    consumer_args: tuple[str, ...] = ()
    processor_id: str = "tokentrail-processor"
    with_pipeline: bool = True  # False: only the policy server and the interceptor (benchmarks)
    upstream_url: str | None = None  # a running engine (real vLLM) instead of a spawned `tokentrail policy`
    interceptor_in_engine: bool = False  # the engine runs the interceptor as middleware: spawn none
    rollout_secret: str | None = None  # TOKENTRAIL_ROLLOUT_SECRET of the interceptor: harnesses need rollout tokens
    sink: str = "jsonl"  # the consumer's sink: "jsonl" (rollouts_path) or "kafka" (the prefixed rebuilt topic)
    die_with_parent: bool = False  # services get SIGTERM when this process dies (kill -9 included)
    services: dict[str, Service] = field(default_factory=dict)

    @property
    def topics(self) -> TopicNames:
        return topic_names(self.topic_prefix)

    @property
    def rollouts_path(self) -> Path:
        return self.run_dir / "rollouts.jsonl"

    # -- lifecycle --------------------------------------------------------------
    def start(self) -> LocalStack:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        ensure_topics(self.bootstrap, self.topics)
        prefix = ("--topic-prefix", self.topic_prefix)
        try:
            if self.upstream_url is None:
                policy = self._spawn("policy", "policy", "--port", "0", *self.policy_args, env=self.policy_env)
                policy.url = self._wait_line(policy, "policy listening on ").split()[-1]
            if not self.interceptor_in_engine:
                port = _free_port()
                interceptor = self._spawn("interceptor", "intercept", "--upstream", self.policy_url, "--bootstrap",
                                          self.bootstrap, "--port", str(port), *prefix, *self.intercept_args,
                                          env={"TOKENTRAIL_CONTROL_TOKEN": self.control_token,
                                               **({"TOKENTRAIL_ROLLOUT_SECRET": self.rollout_secret}
                                                  if self.rollout_secret else {})})
                interceptor.url = f"http://127.0.0.1:{port}"
                self._wait_http(interceptor, "/healthz")
            if not self.with_pipeline:
                return self
            processor = self._spawn("processor", "process", "--bootstrap", self.bootstrap, "--data-dir",
                                    str(self.run_dir / "processor"), "--app-id", self.processor_id, *prefix,
                                    "--log-level", "INFO")
            self._wait_line(processor, "Worker ready", timeout=90)
            sink = ("--sink", "jsonl", "--sink-path", str(self.rollouts_path)) if self.sink == "jsonl" else \
                ("--sink", self.sink)
            self._spawn("consumer", "consume", "--bootstrap", self.bootstrap, *sink,
                        "--group-id", f"{self.processor_id}-consumer", *prefix, *self.consumer_args)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for service in reversed(list(self.services.values())):
            _terminate(service.proc)
        self.services.clear()

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- use ----------------------------------------------------------------------
    @property
    def policy_url(self) -> str:
        """The engine's base URL: the spawned reference server, or ``upstream_url``."""
        return self.upstream_url or str(self.services["policy"].url)

    @property
    def upstream_kind(self) -> str:
        return "reference" if self.upstream_url is None else "vllm"

    def rescore(self, token_ids: list[int]) -> list[float]:
        """log p(t_i | t_<i) for i = 1..n-1, recomputed by the engine in one forward pass.

        The reference server has a scoring route; vLLM scores a prompt with ``prompt_logprobs``
        (``/v1/completions`` with the ids as the prompt: one entry per token, the first null).
        """
        if self.upstream_url is None:
            r = httpx.post(f"{self.policy_url}/tokentrail/score", json={"token_ids": token_ids, "start": 1}, timeout=120)
            r.raise_for_status()
            return r.json()["logprobs"]
        return score_prompt(self.policy_url, token_ids)

    @property
    def interceptor_url(self) -> str:
        if self.interceptor_in_engine:
            return self.policy_url
        return str(self.services["interceptor"].url)

    def capture_base_url(self, rollout_id: str) -> str:
        """What a harness gets as its OpenAI base URL for one rollout."""
        return capture_root(self.interceptor_url, rollout_id) + "/v1"

    def api_key(self, rollout_id: str) -> str:
        """What a harness of ``rollout_id`` sends as its API key: its rollout token when the stack has a secret."""
        return harness_api_key(self.rollout_secret, rollout_id)

    def finish(self, rollout_id: str, result: Any, *, final_response_id: str | None = None,
               final_text: str | None = None) -> None:
        r = httpx.post(f"{self.interceptor_url}/rollouts/{rollout_id}/finish", timeout=30,
                       headers={"authorization": f"Bearer {self.control_token}"},
                       json={"result": result, "final_response_id": final_response_id, "final_text": final_text})
        r.raise_for_status()

    def wait_rollouts(self, rollout_ids: list[str], timeout: float = 60.0) -> dict[str, dict[str, Any]]:
        """The delivered JSON record of each rollout (the latest version), waiting for all of them."""
        deadline = time.monotonic() + timeout
        found: dict[str, dict[str, Any]] = {}
        while time.monotonic() < deadline:
            found = {}
            if self.rollouts_path.exists():
                for line in self.rollouts_path.read_text().splitlines():
                    record = json.loads(line)
                    if record["rollout_id"] in rollout_ids:
                        found[record["rollout_id"]] = record
            if set(found) >= set(rollout_ids):
                return found
            self._check_alive()
            time.sleep(0.2)
        missing = sorted(set(rollout_ids) - set(found))
        raise StackError(f"rollouts {missing} were not delivered within {timeout:.0f} s\n" + self._logs())

    # -- internals ----------------------------------------------------------------
    def _spawn(self, name: str, *argv: str, env: dict[str, str] | None = None) -> Service:
        log = self.run_dir / f"{name}.log"
        handle = open(log, "wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "compose.cli", *argv],
            stdout=handle, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            preexec_fn=_die_with_parent if self.die_with_parent else None,
        )
        handle.close()
        service = Service(name, proc, log)
        self.services[name] = service
        return service

    def _wait_line(self, service: Service, needle: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in service.log.read_text(errors="replace").splitlines():
                if needle in line:
                    return line.strip()
            if service.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise StackError(f"{service.name} did not report {needle!r}:\n{service.log_tail()}")

    def _wait_http(self, service: Service, path: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{service.url}{path}", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if service.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise StackError(f"{service.name} did not answer {path}:\n{service.log_tail()}")

    def _check_alive(self) -> None:
        for service in self.services.values():
            if service.proc.poll() is not None:
                raise StackError(f"{service.name} exited with {service.proc.returncode}:\n{service.log_tail()}")

    def _logs(self) -> str:
        return "\n".join(f"--- {s.name} ---\n{s.log_tail(15)}" for s in self.services.values())


def capture_root(interceptor_url: str, rollout_id: str) -> str:
    """The capture prefix of one rollout on an interceptor (a dialect's API path follows it)."""
    return f"{interceptor_url.rstrip('/')}/ng-rollout/{rollout_id}/training-token-capture"


def harness_api_key(rollout_secret: str | None, rollout_id: str) -> str:
    """The API key a harness of ``rollout_id`` sends: its rollout token under a secret, else a dummy."""
    if rollout_secret is None:
        return "not-needed"
    from schemas.rollout_tokens import rollout_token

    return rollout_token(rollout_secret, rollout_id)


def _terminate(proc: subprocess.Popen, grace: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the spawning thread's process dies (PR_SET_PDEATHSIG)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
