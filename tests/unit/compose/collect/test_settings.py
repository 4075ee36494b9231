"""CollectSettings: refused combinations name what is missing and how to fix it, before any I/O."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from compose.collect.settings import CollectSettings

BASE = dict(tasks=Path("t.jsonl"), out=Path("out/results.jsonl"))


def test_a_remote_stack_needs_its_addresses():
    with pytest.raises(ValidationError, match="bootstrap and interceptor_url missing.*--local"):
        CollectSettings(**BASE, harness="codex")
    ok = CollectSettings(**BASE, harness="codex", bootstrap="127.0.0.1:9092", interceptor_url="http://x:1")
    assert ok.journal_path == Path("out/results.journal.jsonl")
    assert ok.failures_path == Path("out/results.failures.jsonl")
    assert ok.trajectories_dir == Path("out/results.trajectories")


@pytest.mark.parametrize("kw,match", [
    (dict(harness="remote", local=True), "agent_url"),
    (dict(harness="codex", local=True, agent_url="http://a"), "only for --harness remote"),
    (dict(harness="codex", local=True, interceptor_url="http://x:1"), "drop --interceptor-url"),
    (dict(harness="codex", engine="vllm", bootstrap="h:1", interceptor_url="http://x:1"), "--local option"),
    (dict(harness="codex", local=True, run_id="a.b"), "no '.'"),
    (dict(harness="codex", local=True, samples=0), "samples"),
    (dict(harness="codex", local=True, bootstrap="nohostport"), "nohostport"),
    (dict(harness="codex", local=True, colour="red"), "colour"),
])
def test_refusals(kw, match):
    with pytest.raises(ValidationError, match=match):
        CollectSettings(**BASE, **kw)


def test_harness_model_defaults_per_harness():
    assert CollectSettings(**BASE, harness="anthropic-sdk", local=True).harness_model == "claude-opus-5-5"
    assert CollectSettings(**BASE, harness="claude-code", local=True).harness_model is None
    assert CollectSettings(**BASE, harness="codex", local=True, model="m").harness_model == "m"
