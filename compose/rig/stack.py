"""A local tokentrail stack as child processes: policy server, interceptor, processor, consumer.

Used by the demo and the end-to-end tests. Every service is the real
``tokentrail`` subcommand in its own process (its own event loop, signals and
logs under ``run_dir``), talking to a real Kafka broker. ``start()`` starts the
interceptor, processor and consumer side by side and returns once the interceptor
answers and the processor joined its group; ``stop()`` signals them all at once,
SIGKILLs what is left after a grace period, and never leaves one behind.

Kafka security: each service connects with its role's client config file (``kafka_configs``; one file
for every role: `one_kafka_config`), given as ``--kafka-config`` and as ``TOKENTRAIL_KAFKA_CONFIG`` in
its environment; a role without one gets that variable empty, so a value the spawning process inherited
never leaks into a service of a PLAINTEXT stack. The policy server gets the interceptor's (the capture
middleware runs inside the engine when its arguments load it).
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from compose.engines.vllm_rig.engine import score_prompt
from compose.procs.service import Service, StackError, pick_free_ports, spawn, terminate
from schemas.kafka.admin import ensure_topics
from schemas.kafka.security import ENV_VAR as KAFKA_CONFIG_ENV
from schemas.kafka.security import KafkaConfigError, KafkaSecurity, load_kafka_config
from schemas.kafka.topics import DEFAULT_PARTITIONS, TopicNames, topic_names

# The demo's broker keeps its log after the demo (stopped, not deleted), so that
# `tokentrail replay --last-demo` can explain the demo's rollouts afterwards.
DEMO_DIR = Path(".tokentrail/demo")
LAST_RUN = DEMO_DIR / "last-run.json"

# The roles of LocalStack.kafka_configs; the subcommand a service runs -> the role it connects as.
STACK_ROLES = ("admin", "interceptor", "processor", "consumer")
_ROLE_OF = {"policy": "interceptor", "intercept": "interceptor", "process": "processor", "consume": "consumer"}


def one_kafka_config(path: str | os.PathLike[str] | None) -> dict[str, Path]:
    """``kafka_configs`` with the one file ``path`` (a user's ``--kafka-config``) for every role; {} for None.

    The path is made absolute, so a service started in another directory reads the same file (whose relative
    TLS paths are relative to the file itself).
    """
    return {} if path is None else {role: Path(path).resolve() for role in STACK_ROLES}


def kafka_configs_of_args(args: Any) -> dict[str, Path]:
    """``kafka_configs`` of a tool's stack from its ``--kafka-config`` and ``--bootstrap``, checked before any I/O.

    `KafkaConfigError` for an invalid file (naming the key), and for a secured file without ``--bootstrap``:
    the broker a tool starts itself is PLAINTEXT.
    """
    path = getattr(args, "kafka_config", None)
    if not path:
        return {}
    security = load_kafka_config(path)
    if security.secured and getattr(args, "bootstrap", None) is None:
        raise KafkaConfigError(f"--kafka-config {path} ({security.describe()}) needs --bootstrap of the secured "
                               "broker: the broker this tool starts itself is PLAINTEXT")
    return one_kafka_config(path)


def role_security(kafka_configs: dict[str, Path], role: str) -> KafkaSecurity | None:
    """The `KafkaSecurity` of ``role``'s file in ``kafka_configs``; None (PLAINTEXT) without one."""
    path = kafka_configs.get(role)
    return load_kafka_config(path) if path is not None else None


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
    partitions: int = DEFAULT_PARTITIONS  # of the topics it creates; its fold workers are told the same
    sink: str = "jsonl"  # the consumer's sink: "jsonl" (rollouts_path) or "kafka" (the prefixed rebuilt topic)
    die_with_parent: bool = False  # services get SIGTERM when the spawning thread ends (kill -9 included): _die_with_parent
    # How long the fold workers and consumers wait at start for the broker (--topic-wait). The product's 10 s
    # fails fast on a wrong address; on a loaded 2-core VM the rig's own broker was seen silent for longer.
    topic_wait_s: float = 60.0
    # A secured broker: role -> its client config file (--kafka-config), for the roles "admin" (creates the
    # topics, reads positions), "interceptor", "processor" and "consumer"; empty: PLAINTEXT.
    kafka_configs: dict[str, Path] = field(default_factory=dict)
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
        ensure_topics(self.bootstrap, self.topics, self.partitions, security=self.security("admin"))
        try:
            if self.upstream_url is None:
                policy = self._spawn("policy", "policy", "--port", "0", *self.policy_args, env=self.policy_env)
                policy.url = policy.wait_line("policy listening on ").split()[-1]
            # The pipeline's processes start side by side: each start is mostly its imports and, for the
            # fold worker, a group join; one after another they took ~4 s of every stack's start.
            processor = self.add_processor("processor", wait=False) if self.with_pipeline else None
            if self.with_pipeline:
                self.add_consumer("consumer", sink_path=self.rollouts_path)
            if not self.interceptor_in_engine:
                self.add_interceptor("interceptor")
            if processor is not None:
                processor.wait_line("Worker ready", timeout=90)
        except BaseException:
            self.stop()
            raise
        return self

    # -- more services (scale-out) ------------------------------------------------
    def add_interceptor(self, name: str) -> Service:
        """Spawn an interceptor called ``name`` in front of the engine; returns once it answers /healthz."""
        (port,) = pick_free_ports(1)
        service = self._spawn(name, "intercept", "--upstream", self.policy_url, "--bootstrap", self.bootstrap,
                              "--port", str(port), "--topic-prefix", self.topic_prefix,
                              *self._kafka_config_args("interceptor"), *self.intercept_args,
                              env={"TOKENTRAIL_CONTROL_TOKEN": self.control_token,
                                   **({"TOKENTRAIL_ROLLOUT_SECRET": self.rollout_secret}
                                      if self.rollout_secret else {})})
        service.url = f"http://127.0.0.1:{port}"
        service.wait_http("/healthz")
        return service

    def add_processor(self, name: str, *, wait: bool = True) -> Service:
        """Spawn a fold worker called ``name`` in the stack's group (``processor_id``), data dir ``run_dir/name``.

        With ``wait``, returns once it logged "Worker ready" (it has joined the group).
        """
        service = self._spawn(name, "process", "--bootstrap", self.bootstrap, "--data-dir", str(self.run_dir / name),
                              "--app-id", self.processor_id, "--partitions", str(self.partitions),
                              "--topic-prefix", self.topic_prefix, "--topic-wait", str(self.topic_wait_s),
                              *self._kafka_config_args("processor"), "--log-level", "INFO")
        if wait:
            service.wait_line("Worker ready", timeout=90)
        return service

    def add_consumer(self, name: str, *, group_id: str | None = None, sink_path: Path | None = None) -> Service:
        """Spawn a rebuild consumer called ``name`` in ``group_id`` (default: the stack's consumer group).

        It delivers to the JSONL file ``sink_path`` (default ``run_dir/<name>.jsonl``) when the stack's
        sink is "jsonl", else to the stack's sink.
        """
        path = sink_path or self.run_dir / f"{name}.jsonl"
        sink = ("--sink", "jsonl", "--sink-path", str(path)) if self.sink == "jsonl" else ("--sink", self.sink)
        return self._spawn(name, "consume", "--bootstrap", self.bootstrap, *sink,
                           "--group-id", group_id or f"{self.processor_id}-consumer",
                           "--topic-prefix", self.topic_prefix, "--topic-wait", str(self.topic_wait_s),
                           # INFO: its group's assignments, which a failed wait_rollouts prints
                           "--log-level", "INFO", *self._kafka_config_args("consumer"), *self.consumer_args)

    def wait_log(self, name: str, needle: str, timeout: float = 90.0) -> str:
        """Wait until the service ``name`` logged a line containing ``needle``; that line."""
        return self._service(name).wait_line(needle, timeout=timeout)

    def remove(self, name: str, sig: int = signal.SIGTERM, grace: float = 10.0) -> int:
        """Stop the service ``name`` and forget it (scale-in: its exit is no failure of the stack); its exit code.

        SIGTERM is a clean stop (SIGKILL after ``grace`` s); SIGKILL is a crash, as ``kill`` does.
        """
        service = self._service(name)
        del self.services[name]  # first: a watcher of the stack must never see this exit as a failure
        if sig != signal.SIGKILL:
            terminate(service.proc, grace=grace)
        elif service.proc.poll() is None:
            os.killpg(service.proc.pid, signal.SIGKILL)
            service.proc.wait()
        return service.proc.returncode

    def stop(self) -> None:
        terminate(*(service.proc for service in reversed(list(self.services.values()))))
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

    def capture_base_url(self, rollout_id: str, *, via: str | None = None) -> str:
        """What a harness gets as its OpenAI base URL for one rollout (``via``: an added interceptor's name)."""
        return capture_root(self._url_of(via), rollout_id) + "/v1"

    def api_key(self, rollout_id: str) -> str:
        """What a harness of ``rollout_id`` sends as its API key: its rollout token when the stack has a secret."""
        return harness_api_key(self.rollout_secret, rollout_id)

    def finish(self, rollout_id: str, result: Any, *, final_response_id: str | None = None,
               final_text: str | None = None, via: str | None = None) -> None:
        """POST the rollout's finish to the interceptor (``via``: an added interceptor's name)."""
        r = httpx.post(f"{self._url_of(via)}/rollouts/{rollout_id}/finish", timeout=30,
                       headers={"authorization": f"Bearer {self.control_token}"},
                       json={"result": result, "final_response_id": final_response_id, "final_text": final_text})
        r.raise_for_status()

    def delivered(self) -> list[dict[str, Any]]:
        """Every record the JSONL sink holds, in delivery order (see `read_delivered`)."""
        return read_delivered(self.rollouts_path)

    def wait_rollouts(self, rollout_ids: list[str], timeout: float = 60.0) -> dict[str, dict[str, Any]]:
        """The delivered JSON record of each rollout (the latest version), waiting for all of them."""
        deadline = time.monotonic() + timeout
        found: dict[str, dict[str, Any]] = {}
        while time.monotonic() < deadline:
            found = {}
            for record in self.delivered():
                if record["rollout_id"] in rollout_ids:
                    found[record["rollout_id"]] = record
            if set(found) >= set(rollout_ids):
                return found
            self.check_alive()
            time.sleep(0.2)
        missing = sorted(set(rollout_ids) - set(found))
        raise StackError(f"rollouts {missing} were not delivered within {timeout:.0f} s\n{self._positions_text()}\n"
                         + self._logs())

    def positions(self) -> dict[str, dict[int, tuple[int, int]]]:
        """Where the pipeline stands: topic -> partition -> (end offset, its group's committed offset).

        rollout-events against the fold workers' group, snapshots against the consumers' group: which
        stage a rollout that was not delivered waits in (a failed `wait_rollouts` prints them). A
        committed offset is -1001 where the group has committed none.
        """
        import confluent_kafka

        from schemas.kafka.config import consumer_config

        out: dict[str, dict[int, tuple[int, int]]] = {}
        for topic, group in ((self.topics.rollout_events, self.processor_id),
                             (self.topics.snapshots, f"{self.processor_id}-consumer")):
            client = confluent_kafka.Consumer(consumer_config(self.bootstrap, group,  # never joins: reads only
                                                              security=self.security("admin")))
            try:
                parts = [confluent_kafka.TopicPartition(topic, p) for p in range(self.partitions)]
                committed = {tp.partition: tp.offset for tp in client.committed(parts, timeout=10)}
                out[topic] = {tp.partition: (client.get_watermark_offsets(tp, timeout=10)[1], committed[tp.partition])
                              for tp in parts}
            finally:
                client.close()
        return out

    def _positions_text(self) -> str:
        try:
            positions = self.positions()
        except Exception as exc:  # a diagnosis only: never hide the failure it explains
            return f"--- positions ---\nunknown: {exc!r}"
        lines = [f"{topic}: " + ", ".join(f"[{p}] end {end} committed {done}" for p, (end, done) in parts.items())
                 for topic, parts in positions.items()]
        return "--- positions (end offset, committed by the fold workers / the consumers) ---\n" + "\n".join(lines)

    # -- faults (chaos) -------------------------------------------------------------
    def kill(self, name: str) -> int:
        """SIGKILL service ``name``'s process group (a crash: no handler, no flush) and reap it; returns its pid.

        The service stays in ``services`` (dead) until ``restart(name)``.
        """
        service = self._service(name)
        if service.proc.poll() is None:
            try:
                os.killpg(service.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        service.proc.wait()
        return service.proc.pid

    def restart(self, name: str, *, timeout: float = 90.0) -> Service:
        """Start a dead service again with the arguments and environment of its first start.

        The same port (interceptor), data dir (processor), spool (``--spool-dir``), sink and
        group id, so a restart is the same service coming back; its log is appended to.
        Returns once it is ready as ``start`` waits for it (an interceptor: ``/healthz``;
        a fold worker: a new "Worker ready" line). The policy server cannot be restarted (it
        listens on a port picked at start, which the interceptor already points at).
        """
        old = self._service(name)
        if old.proc.poll() is None:
            raise StackError(f"{name} is still running (pid {old.proc.pid}): kill it first")
        command = old.argv[0] if old.argv else ""
        if command == "policy":
            raise StackError("the policy server cannot be restarted: it listens on a port picked at start")
        since = old.log.stat().st_size if old.log.exists() else 0
        service = self._spawn(name, *old.argv, env=old.env, append=True)
        service.url = old.url
        if command == "intercept":  # by subcommand, so added services (add_interceptor/add_processor) restart too
            service.wait_http("/healthz", timeout=timeout)
        elif command == "process":
            service.wait_line("Worker ready", timeout=timeout, since=since)
        return service

    def exited(self) -> dict[str, int]:
        """The services whose process has exited, with their return codes (-9: SIGKILL)."""
        return {n: s.proc.returncode for n, s in self.services.items() if s.proc.poll() is not None}

    def _kafka_config_args(self, role: str) -> tuple[str, ...]:
        path = self.kafka_configs.get(role)
        return ("--kafka-config", str(path)) if path is not None else ()

    def security(self, role: str) -> KafkaSecurity | None:
        """How ``role`` ("admin", "interceptor", "processor", "consumer") connects; None: PLAINTEXT."""
        return role_security(self.kafka_configs, role)

    def _url_of(self, interceptor: str | None) -> str:
        return self.interceptor_url if interceptor is None else str(self._service(interceptor).url)

    def _service(self, name: str) -> Service:
        if name not in self.services:
            raise StackError(f"no service {name!r} in this stack; it runs {sorted(self.services)}")
        return self.services[name]

    # -- internals ----------------------------------------------------------------
    def _spawn(self, name: str, *argv: str, env: dict[str, str] | None = None, append: bool = False) -> Service:
        role = _ROLE_OF.get(argv[0]) if argv else None
        if role is not None:  # the role's file, or empty: never the spawning process's inherited value
            config = self.kafka_configs.get(role)
            env = {KAFKA_CONFIG_ENV: "" if config is None else str(config), **(env or {})}
        service = spawn(name, argv, log=self.run_dir / f"{name}.log", env=env, append=append,
                        die_with_parent=self.die_with_parent)
        self.services[name] = service
        return service

    def check_alive(self) -> None:
        """Raise `StackError` with its log's end if a service has exited."""
        for service in self.services.values():
            if service.proc.poll() is not None:
                raise StackError(f"{service.name} exited with {service.proc.returncode}:\n{service.log_tail()}")

    def _logs(self) -> str:
        return "\n".join(f"--- {s.name} ---\n{s.log_tail(15)}" for s in self.services.values())


def read_delivered(path: Path) -> list[dict[str, Any]]:
    """The records of a JSONL sink file, in order; none if it does not exist yet.

    Whole lines only: a reader polling the file can find the consumer half-way through writing a
    large record (a 10,000-token rollout is ~1 MB), and that line is left for the next read.
    """
    if not path.exists():
        return []
    lines = path.read_bytes().splitlines(keepends=True)
    if lines and not lines[-1].endswith(b"\n"):
        lines.pop()
    return [json.loads(line) for line in lines]


def capture_root(interceptor_url: str, rollout_id: str) -> str:
    """The capture prefix of one rollout on an interceptor (a dialect's API path follows it)."""
    return f"{interceptor_url.rstrip('/')}/ng-rollout/{rollout_id}/training-token-capture"


def harness_api_key(rollout_secret: str | None, rollout_id: str) -> str:
    """The API key a harness of ``rollout_id`` sends: its rollout token under a secret, else a dummy."""
    if rollout_secret is None:
        return "not-needed"
    from schemas.rollout_tokens import rollout_token

    return rollout_token(rollout_secret, rollout_id)
