"""Lint and types are part of the suite: a ruff finding or a mypy error fails ``make test``.

- ruff: the rules of ``[tool.ruff]`` (pyproject.toml), over the whole repository.
- mypy: ``[tool.mypy]`` over the runtime packages and compose: strict on schemas, processors and
  consumers.rebuild, default mode elsewhere. tests/ is not type-checked (the suite runs it).

``make lint`` runs the same two commands alone.
"""

from __future__ import annotations

import subprocess

from tests.unit.lint_jobs import BIN, MYPY_TARGETS, REPO, mypy_result


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=REPO, capture_output=True, text=True)


def test_ruff_finds_nothing():
    result = _run(str(BIN / "ruff"), "check", ".")
    assert result.returncode == 0, f"ruff check . (exit {result.returncode}):\n{result.stdout}{result.stderr}"


def test_mypy_finds_nothing():
    returncode, output = mypy_result()
    assert returncode == 0, f"mypy {' '.join(MYPY_TARGETS)} (exit {returncode}):\n{output}"
