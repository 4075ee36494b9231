"""The chaos consumer-kill sink: it dies right after the planned deliveries, never twice at one count."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from compose.tools.chaos.killsink import TARGET, KillingSink, write_plan
from consumers.sinks.conformance import run_conformance
from consumers.sinks.plugin import load_sink
from schemas.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[5]

_DELIVER = """
import asyncio, json, sys
from consumers.sinks.conformance import sample_rollout
from consumers.sinks.plugin import load_sink
sink = load_sink(sys.argv[1], json.loads(sys.argv[2]))
async def main():
    for rid in sys.argv[3].split(","):
        await sink.deliver(sample_rollout(rid))
    await sink.close()
asyncio.run(main())
"""


def _kwargs(tmp_path: Path) -> dict[str, str]:
    return {"path": str(tmp_path / "out.jsonl"), "count_path": str(tmp_path / "count"),
            "plan_path": str(tmp_path / "plan")}


def _deliver(kwargs: dict[str, str], rollouts: str) -> int:
    proc = subprocess.run([sys.executable, "-c", _DELIVER, TARGET, json.dumps(kwargs), rollouts], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode in (0, -signal.SIGKILL), proc.stderr
    return proc.returncode


def _delivered(kwargs: dict[str, str]) -> list[str]:
    return [json.loads(line)["rollout_id"] for line in Path(kwargs["path"]).read_text().splitlines()]


def test_it_sigkills_its_process_right_after_a_planned_delivery_was_made_durable(tmp_path):
    kwargs = _kwargs(tmp_path)
    write_plan(Path(kwargs["plan_path"]), [2])
    assert _deliver(kwargs, "a,b,c") == -signal.SIGKILL
    assert _delivered(kwargs) == ["a", "b"]  # b was durable before the kill; c never came
    # restarted: b is delivered again (the consumer had not committed it), which is no new delivery
    assert _deliver(kwargs, "b,c") == 0
    assert _delivered(kwargs) == ["a", "b", "c"]
    assert Path(kwargs["count_path"]).read_text() == "3"


def test_a_malformed_plan_fails_at_startup_naming_the_file(tmp_path):
    kwargs = _kwargs(tmp_path)
    Path(kwargs["plan_path"]).write_text('{"kill": 2}')
    with pytest.raises(ConfigError, match="plan"):
        load_sink(TARGET, kwargs)


async def test_without_a_plan_it_is_a_conforming_jsonl_sink(tmp_path):
    kwargs = _kwargs(tmp_path)

    def read_back():
        path = Path(kwargs["path"])
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    passed = await run_conformance(lambda: KillingSink(**kwargs), read_back=read_back)
    assert "restart_idempotent" in passed and "durable_when_deliver_returns" in passed
