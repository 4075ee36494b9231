"""``tokentrail collect`` driving a remote agent service (the Responses contract) through the capture
stack, and ``--local`` bringing the whole stack up for a run.

* The sample service (``compose.collect.agent_service``) runs a multi-step tool loop: its
  tool asks are executed by the collector in the rollout's working directory, its model
  calls go through the rollout's capture URL, and it answers 15 for the task's numbers:
  reward 1.0 from the real verifier, a rebuilt unmasked chain of its 3 model calls.
* A service that answers a malformed object gives a terminal ``schema_error`` row (one
  attempt); a service that is down gives non-terminal ``transport_error`` attempts, retried
  up to --max-attempts, then a sentinel row.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from compose.procs.service import pick_free_ports
from tests.integration.collect.conftest import collect_argv, rows, run_collect

pytestmark = [pytest.mark.integration, pytest.mark.real_broker]

SUM_TASK = {"id": "file-sum", "prompt": "Add up the numbers in numbers.txt. Give your final answer as "
            "<answer>...</answer>.", "answer": 15, "files": {"numbers.txt": "1\n2\n3\n4\n5\n"}}



@pytest.fixture
def agent_service(request):
    mode = getattr(request, "param", "normal")
    port = pick_free_ports(1)[0]
    proc = subprocess.Popen([sys.executable, "-m", "compose.collect.agent_service", "--port", str(port), "--mode", mode],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = proc.stdout.readline()
    assert "listening on" in line, line + (proc.stdout.read() if proc.poll() is not None else "")
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(10)


def _tasks(tmp_path, *tasks) -> object:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return path


def test_remote_agent_tool_loop_reaches_reward_one(collect_stack, agent_service, tmp_path):
    out = tmp_path / "results.jsonl"
    done = run_collect(collect_argv(collect_stack, _tasks(tmp_path, SUM_TASK), out, "remote",
                                    "--agent-url", agent_service, "--samples", "2"))
    assert done.returncode == 0, done.stdout + done.stderr
    got = rows(out)
    assert len(got) == 2
    for row in got:
        assert row["failure_class"] is None and row["reward"] == 1.0, row
        assert row["verifier"]["extracted"] == "15" and row["mask_sample"] is False, row
        m = row["_ng_token_capture"]
        assert m["n_calls"] == 3 and m["chains"] == 1, m
    assert len({r["group_id"] for r in got}) == 1 and len({r["rollout_id"] for r in got}) == 2
    assert "reward mean 1.000" in done.stdout


@pytest.mark.parametrize("agent_service", ["malformed"], indirect=True)
def test_malformed_reply_is_a_terminal_failure(collect_stack, agent_service, tmp_path):
    out = tmp_path / "results.jsonl"
    done = run_collect(collect_argv(collect_stack, _tasks(tmp_path, SUM_TASK), out, "remote",
                                    "--agent-url", agent_service, "--max-attempts", "3"))
    assert done.returncode == 0, done.stdout + done.stderr
    (row,) = rows(out)
    assert row["failure_class"] == "schema_error" and row["terminal"] is True and row["attempts"] == 1
    assert row["reward"] == 0.0 and row["mask_sample"] is True
    assert len(rows(out.with_name("results.failures.jsonl"))) == 1
    # A re-run keeps a terminal failure: nothing is retried.
    again = run_collect(collect_argv(collect_stack, _tasks(tmp_path, SUM_TASK), out, "remote",
                                     "--agent-url", agent_service, "--max-attempts", "3"))
    assert again.returncode == 0 and rows(out) == [row]


def test_service_down_is_retried_then_a_sentinel_row(collect_stack, tmp_path):
    out = tmp_path / "results.jsonl"
    down = f"http://127.0.0.1:{pick_free_ports(1)[0]}"
    argv = collect_argv(collect_stack, _tasks(tmp_path, SUM_TASK), out, "remote", "--agent-url", down,
                        "--max-attempts", "2")
    done = run_collect(argv)
    assert done.returncode == 0, done.stdout + done.stderr
    (row,) = rows(out)
    assert row["failure_class"] == "transport_error" and row["terminal"] is False and row["attempts"] == 2
    failures = rows(out.with_name("results.failures.jsonl"))
    assert [f["rollout_id"].endswith(".a1") for f in failures] == [False, True]
    # With more attempts allowed, a re-run tries the non-terminal failure again.
    again = run_collect(argv[:-1] + ["3"])
    assert again.returncode == 0
    (row,) = rows(out)
    assert row["attempts"] == 3 and row["rollout_id"].endswith(".a2")


def test_local_brings_the_stack_up_for_a_run(tmp_path):
    from tests.integration.collect.conftest import write_tasks

    tasks = write_tasks(tmp_path / "tasks.jsonl", 2)
    out = tmp_path / "results.jsonl"
    done = run_collect([sys.executable, "-m", "compose.cli", "collect", "--local", "--tasks", str(tasks),
                        "--harness", "openai-sdk", "--samples", "2", "--out", str(out), "--no-progress"], timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    got = rows(out)
    assert len(got) == 4 and all(r["failure_class"] is None and r["mask_sample"] is False for r in got), got
    assert "local stack: kafka" in done.stdout and "collect: 4/4 rollouts" in done.stdout


def test_a_larger_limit_extends_the_run(collect_stack, agent_service, tmp_path):
    second = dict(SUM_TASK, id="file-sum-2", files={"numbers.txt": "10\n20\n"}, answer=30)
    out = tmp_path / "results.jsonl"
    argv = collect_argv(collect_stack, _tasks(tmp_path, SUM_TASK, second), out, "remote", "--agent-url", agent_service)
    assert run_collect(argv + ["--limit", "1"]).returncode == 0
    (first,) = rows(out)
    done = run_collect(argv + ["--limit", "2"])
    assert done.returncode == 0 and "(resumed)" in done.stdout, done.stdout + done.stderr
    got = {r["task_id"]: r for r in rows(out)}
    assert got["file-sum"] == first and got["file-sum-2"]["reward"] == 1.0
