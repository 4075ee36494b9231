"""Lint and types are part of the suite: a ruff finding or a mypy error fails ``make test``.

- ruff: the rules of ``[tool.ruff]`` (pyproject.toml), over the whole repository.
- mypy: ``[tool.mypy]`` over the runtime packages and compose: strict on schemas, processors and
  consumers.rebuild, default mode elsewhere. tests/ is not type-checked (the suite runs it).

``make lint`` runs the same two commands alone.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the venv's bin: ruff and mypy are dev dependencies
MYPY_TARGETS = ("schemas", "producers", "processors", "consumers", "compose")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=REPO, capture_output=True, text=True)


def test_ruff_finds_nothing():
    result = _run(str(BIN / "ruff"), "check", ".")
    assert result.returncode == 0, f"ruff check . (exit {result.returncode}):\n{result.stdout}{result.stderr}"


def test_mypy_finds_nothing():
    # The repository's cache: about 30 s cold on 2 cores, a second or two warm.
    result = _run(str(BIN / "mypy"), "--cache-dir", str(REPO / ".mypy_cache"), *MYPY_TARGETS)
    assert result.returncode == 0, (f"mypy {' '.join(MYPY_TARGETS)} (exit {result.returncode}):\n"
                                    f"{result.stdout}{result.stderr}")
