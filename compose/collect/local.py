"""``tokentrail collect --local``: the whole stack on this machine for the length of a run.

A Kafka broker from the Maven jars (unless ``--bootstrap`` names one), the engine (the
reference policy server, or real vLLM's CPU build with ``--engine vllm``), the
interceptor (requiring rollout tokens), the Faust processor and a consumer delivering to
the rebuilt topic, all as child processes under ``<out>.local/``.

Resumable like the run itself: the topic prefix, the processor's id and state directory
and the broker's log are derived from the run id and kept (the broker is stopped with
its data), so a re-run of the same command comes back to the same events and state and
finds the records of rollouts finished before it was stopped. Services die with the
collector (``kill -9`` included), so a killed run leaves no stack behind but the broker,
which a re-run takes up again.

Kafka security (``--kafka-config``) reaches every Kafka client of the run: the collector's own (the
`StackAddress` carries it) and, under ``--local``, the stack's topic admin and every service it starts
(``LocalStack.kafka_configs``: the one file for every role). Only a broker named by ``--bootstrap`` can
be secured; the one ``--local`` starts is PLAINTEXT (``CollectSettings`` refuses the combination).
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from compose.rig.stack import LocalStack, capture_root, harness_api_key, one_kafka_config
from schemas.errors import ConfigError
from schemas.kafka.security import KafkaSecurity
from schemas.kafka.topics import TopicNames, topic_names

if TYPE_CHECKING:
    from compose.engines.vllm_rig.engine import VllmEngine

__all__ = ["StackAddress", "local_stack", "remote_stack"]


@dataclass(frozen=True)
class StackAddress:
    bootstrap: str
    interceptor_url: str
    topics: TopicNames
    rollout_secret: str | None
    kafka: KafkaSecurity = field(default_factory=KafkaSecurity)  # how the collector's clients connect

    def capture_root(self, rollout_id: str) -> str:
        return capture_root(self.interceptor_url, rollout_id)

    def api_key(self, rollout_id: str) -> str:
        return harness_api_key(self.rollout_secret, rollout_id)


def remote_stack(bootstrap: str, interceptor_url: str, topic_prefix: str, rollout_secret: str | None, *,
                 kafka: KafkaSecurity | None = None) -> StackAddress:
    return StackAddress(bootstrap, interceptor_url, topic_names(topic_prefix), rollout_secret, kafka or KafkaSecurity())


@contextlib.contextmanager
def local_stack(root: Path, run_id: str, *, engine: str, harness: str, bootstrap: str | None,
                kafka: KafkaSecurity | None = None) -> Iterator[StackAddress]:
    """Bring the stack up under ``root``; tear it down (the broker's data kept) on exit.

    ``kafka``: the run's security, for a secured ``bootstrap`` only (its file goes to every service).
    """
    kafka = kafka or KafkaSecurity()
    # CollectSettings refuses the first; both guard other callers (the services need the file, not the object).
    if kafka.secured and bootstrap is None:
        raise ConfigError(f"--kafka-config ({kafka.describe()}) needs the secured broker's --bootstrap: --local "
                          "starts a PLAINTEXT broker")
    if kafka.secured and not kafka.source:
        raise ConfigError("the Kafka security of a --local stack must come from a file (load_kafka_config): "
                          "its services are given the file")
    from compose.rig.kafka.broker import broker_status, ensure_jars, restart_broker, start_broker, stop_broker

    root = root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    broker_dir = root / "kafka"
    started_broker = False
    if bootstrap is None:
        ensure_jars()
        kept = (broker_dir / "data").exists() and broker_status(broker_dir) is not None
        info = restart_broker(broker_dir) if kept else start_broker(broker_dir)
        bootstrap, started_broker = info.bootstrap, True
    secret_file = root / "rollout-secret"
    if not secret_file.exists():
        secret_file.write_text(secrets.token_hex(24))
    secret = secret_file.read_text().strip()
    engine_cm: contextlib.AbstractContextManager[VllmEngine | None] = contextlib.nullcontext(None)
    if engine == "vllm":
        from compose.engines.vllm_rig.engine import VllmEngine

        engine_cm = VllmEngine(root / "vllm")
    # The harness CLIs send ~50 KB of system prompt and tools: the reference server's
    # word-level tokenizer needs a long context for them (vLLM keeps its own).
    policy_args = ("--max-model-len", "262144") if harness in ("claude-code", "codex", "gemini-cli") else ()
    try:
        with engine_cm as running_engine:
            stack = LocalStack(bootstrap, root / "stack", topic_prefix=f"collect-{run_id}.",
                               processor_id=f"collect-{run_id}", policy_args=policy_args,
                               upstream_url=None if running_engine is None else running_engine.url,
                               rollout_secret=secret, sink="kafka", die_with_parent=True,
                               kafka_configs=one_kafka_config(kafka.source if kafka.secured else None))
            with stack:
                print(f"local stack: kafka {bootstrap}, engine {stack.upstream_kind} {stack.policy_url}, "
                      f"interceptor {stack.interceptor_url}, logs {root / 'stack'}", flush=True)
                yield StackAddress(bootstrap, stack.interceptor_url, stack.topics, secret, kafka)
    finally:
        if started_broker:
            stop_broker(broker_dir, keep_data=True)
