"""The lean install: the runtime needs none of the extras, and a command that needs one says which.

`pip install tokentrail` installs the runtime's dependencies only ([project].dependencies); the
reference engine, the collector and the tools come with the ``engine``, ``collect`` and ``dev``
extras. Here the extras' modules are made unimportable in a fresh interpreter (a meta-path
finder that refuses them, as a venv without them would), and every runtime module, and the
operator commands, must still import; ``tokentrail policy`` and ``collect`` must exit 2 naming
the extra and the pip command.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXTRAS_ONLY = ("numpy", "openai", "anthropic", "tqdm")  # never a runtime dependency
RUNTIME = ("schemas", "producers", "processors", "consumers", "compose.ops", "compose.rig.kafka")

_BLOCKER = f"""
import importlib.abc, sys
class _Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {EXTRAS_ONLY!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (not installed)", name=name)
        return None
sys.meta_path.insert(0, _Refuse())
"""


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _BLOCKER + code], cwd=REPO, capture_output=True, text=True)


def test_the_runtime_dependencies_carry_no_extra():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[\[=<>~! ]", dep, maxsplit=1)[0].lower() for dep in project["dependencies"]}
    assert names.isdisjoint(EXTRAS_ONLY), names & set(EXTRAS_ONLY)
    assert {"engine", "collect", "dev"} <= set(project["optional-dependencies"])


def test_every_runtime_module_imports_without_the_extras():
    out = _run(f"""
import importlib, json, pkgutil
failed = []
for package in {RUNTIME!r}:
    module = importlib.import_module(package)
    for info in pkgutil.walk_packages(module.__path__, package + "."):
        if info.name.rpartition(".")[2] == "__main__":
            continue
        try:
            importlib.import_module(info.name)
        except Exception as exc:
            failed.append(f"{{info.name}}: {{exc!r}}")
print(json.dumps(failed))
""")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


@pytest.mark.parametrize("command", ["intercept", "process", "consume", "finish", "replay", "topics", "versions",
                                     "kafka", "token"])
def test_a_runtime_command_runs_without_the_extras(command):
    out = _run(f"from compose import cli; raise SystemExit(cli.main([{command!r}, '--help']))")
    assert out.returncode == 0, out.stderr
    assert f"usage: tokentrail {command}" in out.stdout


@pytest.mark.parametrize(("command", "extra"), [("policy", "engine"), ("collect", "collect"), ("demo", "dev"),
                                                ("bench", "dev"), ("chaos", "dev")])
def test_a_command_that_needs_an_extra_names_it(command, extra):
    out = _run(f"from compose import cli; raise SystemExit(cli.main([{command!r}, '--help']))")
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"needs the [{extra}] extra" in out.stderr and f"pip install 'tokentrail[{extra}]'" in out.stderr
    assert "Traceback" not in out.stderr
