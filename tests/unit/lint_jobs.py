"""mypy for ``tests/unit/test_lint.py``, started in the background when collection ends.

A cold run takes about 30 s on 2 cores (a fresh clone has no cache); ``tests/conftest.py`` calls
``start_mypy`` when the session's tests are collected, so the run overlaps the tests before the
one that reads its result. One module holds the process, imported by both under one name.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the venv's bin: ruff and mypy are dev dependencies
MYPY_TARGETS = ("schemas", "producers", "processors", "consumers", "compose")

_mypy: subprocess.Popen[str] | None = None


def start_mypy() -> None:
    """Start mypy over ``MYPY_TARGETS`` with the repository's cache, once."""
    global _mypy
    if _mypy is None:
        _mypy = subprocess.Popen([str(BIN / "mypy"), "--cache-dir", str(REPO / ".mypy_cache"), *MYPY_TARGETS],
                                 cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def mypy_result(timeout: float = 600) -> tuple[int, str]:
    """(exit status, output) of the run ``start_mypy`` started (starting it now if nothing did)."""
    start_mypy()
    assert _mypy is not None
    output, _ = _mypy.communicate(timeout=timeout)
    return _mypy.returncode, output
