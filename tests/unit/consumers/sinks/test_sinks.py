"""Sink plugins: loading and startup checks, the JSONL sink, the in-process stream, the conformance kit."""

from __future__ import annotations

import asyncio
import json
import sys
import types

import pytest

from consumers.sinks.conformance import SinkConformanceError, run_conformance, sample_rollout
from consumers.sinks.plugin import JsonlSink, TrainerSink, load_sink
from consumers.sinks.stream import RolloutStream
from schemas.errors import ConfigError


@pytest.fixture
def plugin_module(monkeypatch):
    """A throwaway module holding sink classes, importable as ``tt_test_sinks``."""
    module = types.ModuleType("tt_test_sinks")

    class Good:
        def __init__(self, path: str, flush_every: int = 1) -> None:
            self.path, self.flush_every = path, flush_every

        async def deliver(self, rollout) -> None: ...

        async def close(self) -> None: ...

    class NoClose:
        async def deliver(self, rollout) -> None: ...

    class NotCallable:
        deliver = "not a method"

        async def close(self) -> None: ...

    class Sync:
        def deliver(self, rollout) -> None: ...

        async def close(self) -> None: ...

    class Exploding:
        def __init__(self, **kwargs) -> None:
            raise TypeError("needs a url")

        async def deliver(self, rollout) -> None: ...

        async def close(self) -> None: ...

    for cls in (Good, NoClose, NotCallable, Sync, Exploding):
        setattr(module, cls.__name__, cls)
    monkeypatch.setitem(sys.modules, "tt_test_sinks", module)
    return module


def test_a_configured_sink_receives_its_kwargs(plugin_module):
    sink = load_sink("tt_test_sinks:Good", {"path": "/x", "flush_every": 3})
    assert isinstance(sink, TrainerSink) and (sink.path, sink.flush_every) == ("/x", 3)


@pytest.mark.parametrize("target, kwargs, message", [
    ("tt_test_sinks:Good", {"path": "/x", "fsync": True}, r"does not accept keyword argument\(s\) \['fsync'\]"),
    ("tt_test_sinks:Good", {}, r"needs keyword argument\(s\) \['path'\]"),
    ("tt_test_sinks:NoClose", {}, "close: missing"),
    ("tt_test_sinks:NotCallable", {}, "deliver: not callable"),
    ("tt_test_sinks:Sync", {}, "deliver: not an async method"),
    ("tt_test_sinks:Exploding", {}, "could not be constructed"),
    ("tt_test_sinks", {}, "must be 'module:Class'"),
    ("tt_test_sinks:Missing", {}, "has no attribute 'Missing'"),
    ("no_such_module_xyz:Sink", {}, "could not load sink"),
])
def test_bad_sinks_are_refused_at_startup_naming_what_is_wrong(plugin_module, target, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        load_sink(target, kwargs)


def test_builtin_names_resolve(tmp_path):
    sink = load_sink("jsonl", {"path": str(tmp_path / "a.jsonl")})
    assert isinstance(sink, JsonlSink)


async def test_jsonl_sink_fsyncs_one_line_per_rollout_and_survives_a_torn_tail(tmp_path):
    path = tmp_path / "out.jsonl"
    sink = JsonlSink(str(path), include_response=False)
    r1, r2 = sample_rollout("a"), sample_rollout("b")
    await sink.deliver(r1)
    await sink.deliver(r1)
    await sink.close()
    with open(path, "ab") as fh:
        fh.write(b'{"rollout_id":"torn"')  # a write that was never acknowledged
    again = JsonlSink(str(path))
    await again.deliver(r1)
    await again.deliver(r2)
    await again.close()
    lines = path.read_text().splitlines()
    assert [json.loads(line)["rollout_id"] for line in lines] == ["a", "b"]
    assert json.loads(lines[0])["mask_sample"] is False


async def test_builtin_jsonl_sink_passes_the_conformance_kit(tmp_path):
    path = tmp_path / "kit.jsonl"

    def read_back():
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    passed = await run_conformance(lambda: JsonlSink(str(path)), read_back=read_back)
    assert passed == ["protocol", "deliver_returns", "durable_when_deliver_returns", "masked_without_trajectory",
                      "idempotent_redelivery", "newer_version_delivered", "large_rollout", "close_idempotent",
                      "restart_idempotent"]


async def test_in_process_stream_passes_the_conformance_kit():
    taken: list = []
    drains: list[asyncio.Task] = []

    def factory():
        stream = RolloutStream(max_buffered=16)

        async def trainer():
            async for rollout in stream:
                taken.append(rollout)

        drains.append(asyncio.create_task(trainer()))
        return stream

    passed = await run_conformance(factory, read_back=lambda: list(taken))
    assert "concurrent_deliveries" in passed and "durable_when_deliver_returns" in passed
    assert "restart_idempotent" not in passed  # deduplication lives in the process
    for task in drains:
        task.cancel()


async def test_the_kit_rejects_a_sink_that_loses_or_duplicates_writes():
    held: list = []

    class Amnesiac:
        async def deliver(self, rollout) -> None:
            pass  # says durable, keeps nothing

        async def close(self) -> None: ...

    with pytest.raises(SinkConformanceError, match="durable_when_deliver_returns"):
        await run_conformance(Amnesiac, read_back=lambda: held)

    class Duplicator:
        async def deliver(self, rollout) -> None:
            held.append(rollout)

        async def close(self) -> None: ...

    with pytest.raises(SinkConformanceError, match="idempotent_redelivery"):
        await run_conformance(Duplicator, read_back=lambda: held)

    class Sync:
        def deliver(self, rollout) -> None: ...

        async def close(self) -> None: ...

    with pytest.raises(SinkConformanceError, match="protocol"):
        await run_conformance(Sync)


async def test_a_hanging_deliver_fails_the_kit_instead_of_hanging_it():
    class Hanging:
        async def deliver(self, rollout) -> None:
            await asyncio.sleep(3600)

        async def close(self) -> None: ...

    with pytest.raises(SinkConformanceError, match="did not return"):
        await run_conformance(Hanging, timeout_s=0.2)
