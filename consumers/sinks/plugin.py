"""Trainer sinks: where rebuilt rollouts go. ``TrainerSink`` is the plugin point.

A sink is any object with the two async methods of the protocol; plugins load
from ``module:Class`` (or a built-in name) with keyword arguments and are
checked at startup: a malformed target, an import failure, a missing,
non-callable or non-async method, an unknown keyword argument or a failing
constructor is a ``ConfigError`` naming what is wrong, before any rollout is
consumed. ``consumers.sinks.conformance.run_conformance`` checks the behaviour.

Optional attributes a sink may declare:
- ``include_response`` (bool, default True): False tells the consumer not to
  build the Responses projection at all;
- ``max_in_flight`` (int, default 1): how many ``deliver`` calls may be
  pending at once (a grouping sink needs the whole group in flight);
- ``idempotent_across_restarts`` (bool, default True): False when a
  redelivery after a restart can reach the trainer twice (its readers then
  deduplicate by ``(snapshot_id, version)``).

Built in: ``jsonl`` (this module), ``kafka`` (``consumers.sinks.kafka``),
``kafka-groups`` (one record per GRPO group, ``consumers.sinks.kafka_groups``), and
the in-process async iterator ``consumers.sinks.stream.RolloutStream``.
"""

from __future__ import annotations

import inspect
import os
import re
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from consumers.rebuild import to_json_line
from schemas.errors import ConfigError
from schemas.plugins import load_class
from schemas.records import RebuiltRollout


@runtime_checkable
class TrainerSink(Protocol):
    """Receives every rebuilt rollout, masked ones included (``mask_sample`` says which).

    Guarantees a sink must give:
    - ``deliver`` returns only when the rollout is durable (or owned by a
      trainer in this process); the consumer commits its offset and retires the
      processor state only after that. Raising means "not delivered": the
      consumer stops without committing, and the rollout is delivered again.
    - ``deliver`` is idempotent by ``(snapshot_id, version)``: after a crash the
      same rollout may be delivered again.
    - ``close`` flushes nothing that ``deliver`` had not already made durable,
      and may be called more than once.
    """

    async def deliver(self, rollout: RebuiltRollout) -> None: ...

    async def close(self) -> None: ...


REQUIRED_METHODS = ("deliver", "close")


class JsonlSink:
    """One JSON object per rollout, appended and fsynced before ``deliver`` returns.

    Idempotent across restarts: the identities already in the file are read at
    open, and a torn last line (a write that was never acknowledged) is cut off.
    """

    def __init__(self, path: str, include_response: bool = True) -> None:
        self.path = Path(path)
        self.include_response = include_response
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._delivered = _identities_in(self.path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    async def deliver(self, rollout: RebuiltRollout) -> None:
        identity = (rollout.snapshot_id, rollout.version)
        if identity in self._delivered:
            return
        if self._fd < 0:
            raise ConfigError(f"JSONL sink {self.path} is closed")
        line = to_json_line(rollout, include_response=self.include_response)
        view = memoryview(line)
        while view:  # os.write may write less than asked on large lines
            view = view[os.write(self._fd, view):]
        os.fsync(self._fd)
        self._delivered.add(identity)

    async def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


_IDENTITY = re.compile(rb'^\{"rollout_id":"(?:[^"\\]|\\.)*","snapshot_id":"([^"]*)","version":(\d+)')


def _identities_in(path: Path) -> set[tuple[str, int]]:
    if not path.exists():
        return set()
    identities = set()
    with open(path, "rb+") as fh:
        good = 0
        for line in fh:
            if not line.endswith(b"\n"):
                break
            good += len(line)
            match = _IDENTITY.match(line)
            if match:
                identities.add((match.group(1).decode(), int(match.group(2))))
        fh.truncate(good)
    return identities


BUILTIN_SINKS = {"jsonl": "consumers.sinks.plugin:JsonlSink", "kafka": "consumers.sinks.kafka:KafkaSink",
                 "kafka-groups": "consumers.sinks.kafka_groups:GroupedKafkaSink"}
# The built-in sinks that write to Kafka -> the ``schemas.kafka.topics.TopicNames`` field of their default
# topic: `tokentrail consume` points them at its own cluster and prefix, and the startup check waits for it.
KAFKA_SINK_TOPICS = {"kafka": "rebuilt", "kafka-groups": "rebuilt_groups"}


def load_sink(target: str, kwargs: dict[str, Any] | None = None) -> TrainerSink:
    """Construct a sink from ``module:Class`` (or a built-in name) and check it honours the protocol."""
    cls, spec = _load_class(target)
    check_sink_class(cls, spec)
    kwargs = dict(kwargs or {})
    params = inspect.signature(cls).parameters
    accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    named = {n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    unknown = sorted(set(kwargs) - named) if not accepts_any else []
    if unknown:
        raise ConfigError(f"sink {spec} does not accept keyword argument(s) {unknown}; it accepts {sorted(named)}")
    missing = sorted(n for n, p in params.items() if n in named and p.default is p.empty and n not in kwargs)
    if missing:
        raise ConfigError(f"sink {spec} needs keyword argument(s) {missing}; pass them in the sink kwargs")
    try:
        sink = cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"sink {spec} could not be constructed with {sorted(kwargs)}: {exc}") from exc
    if not isinstance(sink, TrainerSink):
        raise ConfigError(f"sink {spec} does not implement the TrainerSink protocol (async deliver and close)")
    return sink


def check_sink_class(cls: Any, name: str) -> None:
    """Refuse a class whose protocol methods are missing, not callable or not async, naming them."""
    problems = []
    for method in REQUIRED_METHODS:
        member = getattr(cls, method, None)
        if member is None:
            problems.append(f"{method}: missing")
        elif not callable(member):
            problems.append(f"{method}: not callable ({type(member).__name__})")
        elif not inspect.iscoroutinefunction(member):
            problems.append(f"{method}: not an async method")
    if problems:
        raise ConfigError(f"sink {name} does not implement TrainerSink ({'; '.join(problems)}): "
                          "a TrainerSink needs `async def deliver(self, rollout)` and `async def close(self)`")


def _load_class(target: str) -> tuple[Any, str]:
    spec = BUILTIN_SINKS.get(target, target)
    if ":" not in spec:
        raise ConfigError(f"sink {target!r} must be 'module:Class' or one of {sorted(BUILTIN_SINKS)}")
    return load_class(spec, "sink"), spec
