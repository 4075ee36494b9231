"""The converter, session and rollout_func against TRL's and OpenEnv's own code (trl 1.16.0, openenv 0.10.0).

TRL imports torch, which the core venv does not have; so this test writes the recorded rollouts
(``scenarios``: tool calls, a sub-agent, a fork, a compaction, an untrained summary, a masked
trace, a masked rollout; each encoded as the Kafka sink writes it) and what TRL must build from
each, then runs ``trl_checks.py`` with pytest in .venv-vllm and asserts it passed, printing its
output otherwise. OpenEnv 0.10 imports fastmcp 3, which needs mcp < 2 while vLLM needs mcp >= 2:
fastmcp and its mcp live in ``.tokentrail/trl-overlay``, on the path of this check only (see
`make trl`; docs/trainer-authors.md). Without .venv-vllm or those packages it is
skipped with the command that installs them, except under CI or ``TOKENTRAIL_REQUIRE_TRL=1``,
where it fails.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from schemas.codec import encode_rebuilt
from tests.unit.consumers.trl_source.scenarios import SCENARIOS, expected_sequences

ROOT = Path(__file__).resolve().parents[4]
PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
OVERLAY = ROOT / ".tokentrail" / "trl-overlay"
CHECKS = Path(__file__).with_name("trl_checks.py")
INSTALL = "`make trl` (docs/trainer-authors.md, section \"TRL and OpenEnv\")"


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{OVERLAY}{os.pathsep}{ROOT}", "TOKENIZERS_PARALLELISM": "false"}


def _require_trl() -> None:
    # Found and versioned without importing them: importing trl (torch) takes ~30 s here, and the checks import
    # it once anyway.
    probe = ("import importlib.util as u, importlib.metadata as m; "
             "missing = [n for n in ('trl', 'openenv', 'accelerate', 'datasets', 'fastmcp') if u.find_spec(n) is None]; "
             "assert not missing, f'missing: {missing}'; "
             "assert m.version('trl') == '1.16.0', m.version('trl')")
    if not PYTHON.exists():
        reason = f".venv-vllm is missing ({PYTHON}); build it with `make vllm`, then {INSTALL}"
    else:
        out = subprocess.run([str(PYTHON), "-c", probe], capture_output=True, text=True, env=_env(), timeout=300)
        reason = "" if out.returncode == 0 else f"TRL/OpenEnv not importable in .venv-vllm ({out.stderr.strip()[-300:]}); run {INSTALL}"
    if not reason:
        return
    if os.environ.get("CI") or os.environ.get("TOKENTRAIL_REQUIRE_TRL") == "1":
        pytest.fail(f"the TRL/OpenEnv checks must run here: {reason}")
    pytest.skip(f"NOT CHECKED AGAINST TRL/OPENENV: {reason}")


def test_trl_and_openenv_accept_our_turns_and_build_our_sequences(tmp_path):
    _require_trl()
    for name, make in SCENARIOS.items():
        scenario = make()
        (tmp_path / f"{name}.avro").write_bytes(encode_rebuilt(scenario.record))
        reward = json.loads(scenario.record.result_json).get("reward") if scenario.scorable else None
        (tmp_path / f"{name}.expected.json").write_text(json.dumps(
            {"sequences": expected_sequences(scenario), "reward": reward}))
    out = subprocess.run(
        [str(PYTHON), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest", "-c", os.devnull,
         "--rootdir", str(ROOT), "-W", "ignore::UserWarning", str(CHECKS)],
        capture_output=True, text=True, cwd=ROOT, env={**_env(), "TRL_RECORDS_DIR": str(tmp_path)}, timeout=600)
    report = out.stdout[-6000:] + out.stderr[-3000:]
    assert out.returncode == 0, report
    assert " passed" in out.stdout and " skipped" not in out.stdout, report
