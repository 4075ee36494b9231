"""``tokentrail collect`` with the real Claude Code, Codex and Gemini CLIs through the capture stack.

Claude Code, 8 tasks x 2 samples at concurrency 4: the collector is killed (SIGKILL) half-way
and re-run with the same command; it finishes the rest, every rollout has exactly one row,
each verified and rebuilt (one unmasked, token-exact chain) or a failure row with its class;
no rollout is delivered twice on the rebuilt topic, an attempt cut short by the kill is
never delivered and never mixed into its retry (the retry has its own rollout id and one
chain), and no harness process outlives the killed collector.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.integration.collect.conftest import (
    collect_argv,
    kill,
    processes_under,
    rebuilt_deliveries,
    rows,
    run_collect,
    wait_for,
    write_tasks,
)
from tests.integration.engines import assert_one_token_exact_chain

pytestmark = [pytest.mark.integration, pytest.mark.real_broker]


def _check_rows(stack, out, expected_keys: set[str]) -> list[dict]:
    got = rows(out)
    assert sorted(r["key"] for r in got) == sorted(expected_keys), "one row per (task, sample)"
    for row in got:
        if row["failure_class"] is None:
            assert row["verifier"] is not None and row["reward"] in (0.0, 1.0)
            assert row["mask_sample"] is False, row["mask_reasons"]
            m = row["_ng_token_capture"]
            assert m["chains"] == 1 and m["roots"] == 1 and m["delivered_fraction"] == 1.0
        else:
            assert row["reward"] == 0.0 and row["mask_sample"] is True and row["failure_class"]
    return got


def test_claude_code_collect_killed_half_way_then_resumed(claude, collect_stack, tmp_path):
    tasks = write_tasks(tmp_path / "tasks.jsonl", 6)
    out = tmp_path / "results.jsonl"
    argv = collect_argv(collect_stack, tasks, out, "claude-code", "--samples", "2", "--concurrency", "4",
                        "--rollout-timeout", "300", "--run-id", "cc1")
    journal_path = out.with_name("results.journal.jsonl")

    def half_way_with_a_harness_running() -> bool:
        if first.poll() is not None:
            return True
        if len(rows(out)) < 4 or not journal_path.exists():
            return False
        # Whole lines only: drop what follows the last newline (a line being written), never a complete
        # last line (dropping that one, a harness's "finish", made a finished attempt look still running).
        text = journal_path.read_text()
        entries = [json.loads(line) for line in text[:text.rfind("\n") + 1].splitlines()]
        ended = {(e["key"], e["attempt"]) for e in entries if e["type"] in ("finish", "failure")}
        return any(e["type"] == "attempt" and (e["key"], e["attempt"]) not in ended for e in entries)

    first = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # Killed while a harness runs (its attempt journaled, not finished): that attempt is cut short.
        wait_for(half_way_with_a_harness_running, 600, "4 result rows and a harness running", interval=0.02)
        assert first.poll() is None, f"the run ended before it could be killed:\n{first.stdout.read()}"
        kill(first)
    finally:
        if first.poll() is None:
            kill(first)
    done_before = {r["key"] for r in rows(out)}
    # The reapers of the runs in flight got SIGTERM when the collector died: nothing is left.
    wait_for(lambda: not processes_under(tmp_path / "results.work"), 60, "the killed run's harnesses to end")

    second = run_collect(argv, timeout=900)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "(resumed)" in second.stdout and "collect: 12/12 rollouts" in second.stdout, second.stdout
    keys = {f"{json.loads(line)['id']}-{s}" for line in tasks.read_text().splitlines() for s in (0, 1)}
    got = _check_rows(collect_stack, out, keys)
    by_key = {r["key"]: r for r in got}
    assert all(by_key[k]["attempt"] == 0 for k in done_before), "rows written before the kill stand unchanged"

    journal = [json.loads(line) for line in out.with_name("results.journal.jsonl").read_text().splitlines()]
    started = {(e["key"], e["attempt"]): e["rollout_id"] for e in journal if e["type"] == "attempt"}
    finished = {(e["key"], e["attempt"]) for e in journal if e["type"] == "finish"}
    cut_short = [rid for ka, rid in started.items() if ka not in finished
                 and not any(e["type"] == "failure" and (e["key"], e["attempt"]) == ka for e in journal)]
    assert cut_short, "the kill cut at least one attempt short"
    deliveries = rebuilt_deliveries(collect_stack)
    for rid in cut_short:
        assert rid not in deliveries, f"the cut-short attempt {rid} was delivered"
    for row in got:
        if row["failure_class"] is None:
            assert len(deliveries[row["rollout_id"]]) == 1, f"{row['rollout_id']} delivered more than once"
    retried = [r for r in got if r["attempt"] > 0 and r["failure_class"] is None]
    assert retried and all(r["rollout_id"].endswith(f".a{r['attempt']}") for r in retried)
    # Token-exact under re-scoring, a retried rollout included (one chain: nothing of the cut attempt in it).
    for row in retried[:1] + [r for r in got if r["attempt"] == 0 and r["failure_class"] is None][:1]:
        record = json.loads(open(row["trajectory_path"]).read())
        assert_one_token_exact_chain(collect_stack, record)


def _collect_three_tasks(harness: str, collect_stack, tmp_path) -> list[dict]:
    """``tokentrail collect --harness <harness>`` on 3 tasks at concurrency 3: every row verified."""
    tasks = write_tasks(tmp_path / "tasks.jsonl", 3)
    out = tmp_path / "results.jsonl"
    done = run_collect(collect_argv(collect_stack, tasks, out, harness, "--concurrency", "3",
                                    "--rollout-timeout", "300"), timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    keys = {f"{json.loads(line)['id']}-0" for line in tasks.read_text().splitlines()}
    got = _check_rows(collect_stack, out, keys)
    assert all(r["failure_class"] is None for r in got), [r.get("failure_detail") for r in got]
    assert "collect: 3/3 rollouts" in done.stdout
    return got


def test_codex_collect_on_a_few_tasks(codex, collect_stack, tmp_path):
    _collect_three_tasks("codex", collect_stack, tmp_path)


def test_gemini_cli_collect_on_a_few_tasks(gemini_cli, collect_stack, tmp_path):
    got = _collect_three_tasks("gemini-cli", collect_stack, tmp_path)
    assert_one_token_exact_chain(collect_stack, json.loads(open(got[0]["trajectory_path"]).read()))


@pytest.mark.vllm
def test_claude_code_collect_on_real_vllm(claude, kafka_bootstrap, vllm_engine, tmp_path):
    """The same command in front of real vLLM (the crafted checkpoint): verified, rebuilt, token-exact."""
    import uuid

    from compose.rig.stack import LocalStack
    from tests.integration.collect.conftest import SECRET

    tag = uuid.uuid4().hex[:8]
    with LocalStack(kafka_bootstrap, tmp_path / "stack", topic_prefix=f"colv{tag}.", processor_id=f"colv{tag}",
                    upstream_url=vllm_engine.url, rollout_secret=SECRET, sink="kafka") as stack:
        tasks = write_tasks(tmp_path / "tasks.jsonl", 2)
        out = tmp_path / "results.jsonl"
        done = run_collect(collect_argv(stack, tasks, out, "claude-code", "--samples", "2", "--concurrency", "2",
                                        "--rollout-timeout", "300"), timeout=900)
        assert done.returncode == 0, done.stdout + done.stderr
        keys = {f"{json.loads(line)['id']}-{s}" for line in tasks.read_text().splitlines() for s in (0, 1)}
        got = _check_rows(stack, out, keys)
        assert all(r["failure_class"] is None for r in got), [r.get("failure_detail") for r in got]
        # The crafted policy answers "The task is done.": no answer tag, so the verifier says 0.
        assert all(r["reward"] == 0.0 and r["verifier"]["extracted"] is None for r in got)
        assert_one_token_exact_chain(stack, json.loads(open(got[0]["trajectory_path"]).read()))
