"""Trainer sinks: where rebuilt rollouts go. ``TrainerSink`` is the plugin point.

A sink is any object with the two async methods below; plugins load from
``module:Class`` with keyword arguments and are checked at startup (missing
methods and unknown keyword arguments fail before any rollout is consumed,
naming what is wrong).
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import orjson

from consumers.rebuild import to_json_dict
from schemas.errors import ConfigError
from schemas.records import RebuiltRollout


@runtime_checkable
class TrainerSink(Protocol):
    """Receives every rebuilt rollout, masked ones included (``mask_sample`` says which).

    Guarantees a sink must give:
    - ``deliver`` returns only when the rollout is durable (or handed to a
      trainer that owns it); the consumer commits its offset and retires the
      processor state only after that. Raising means "not delivered": the
      consumer stops without committing, and the rollout is delivered again.
    - ``deliver`` is idempotent by ``(snapshot_id, version)``: after a crash the
      same rollout may be delivered again.
    - ``close`` flushes nothing that ``deliver`` had not already made durable,
      and may be called more than once.
    """

    async def deliver(self, rollout: RebuiltRollout) -> None: ...

    async def close(self) -> None: ...


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
        line = orjson.dumps(to_json_dict(rollout, include_response=self.include_response)) + b"\n"
        os.write(self._fd, line)
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


BUILTIN_SINKS = {"jsonl": "consumers.sinks:JsonlSink"}


def load_sink(target: str, kwargs: dict[str, Any] | None = None) -> TrainerSink:
    """Construct a sink from ``module:Class`` (or a built-in name) and check it honours the protocol."""
    kwargs = dict(kwargs or {})
    spec = BUILTIN_SINKS.get(target, target)
    module_name, sep, class_name = spec.partition(":")
    if not sep or not module_name or not class_name:
        raise ConfigError(f"sink {target!r} must be 'module:Class' or one of {sorted(BUILTIN_SINKS)}")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"could not load sink {spec!r}: {exc}") from exc
    missing = [m for m in ("deliver", "close") if not inspect.iscoroutinefunction(getattr(cls, m, None))]
    if missing:
        raise ConfigError(f"sink {spec} lacks async method(s) {missing}: a TrainerSink needs async deliver() and close()")
    params = inspect.signature(cls).parameters
    accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    unknown = sorted(set(kwargs) - set(params)) if not accepts_any else []
    if unknown:
        raise ConfigError(f"sink {spec} does not accept keyword argument(s) {unknown}; it accepts {sorted(params)}")
    try:
        sink = cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"sink {spec} could not be constructed with {sorted(kwargs)}: {exc}") from exc
    if not isinstance(sink, TrainerSink):
        raise ConfigError(f"sink {spec} does not implement the TrainerSink protocol")
    return sink
