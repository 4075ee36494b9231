"""The layout is the architecture (ARCHITECTURE §3), and these tests make it fail loudly.

- Import contracts: ``[tool.importlinter]`` in pyproject.toml, run here with ``lint-imports``
  (a real import graph, not substrings): producers, processors and consumers share only
  schemas (consumers reach processors only through ``processors.fold`` and
  ``processors.replay``); nothing but compose imports compose; pure modules import no framework.
- Pure modules, again in a fresh interpreter: ``sys.modules`` after importing each one holds
  no framework, which also catches imports done at import time through ``importlib``.
  The list is the ``pure`` contract's, so there is one list.
- One exception hierarchy: every exception class the packages define is a ``TokentrailError``.
- Each package resolves inside the repository (PyPI has unrelated ``schemas`` etc.).
"""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("schemas", "producers", "processors", "consumers", "compose")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
# Dialect modules that render HTTP responses (starlette); every other dialect module must be pure.
DIALECT_ADAPTERS = {"chat", "anthropic_adapter", "responses_adapter"}


def _contracts() -> dict[str, dict]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {c["id"]: c for c in config["contracts"]}


PURE = _contracts()["pure"]
FRAMEWORKS = tuple(PURE["forbidden_modules"])


def _submodules(name: str) -> list[str]:
    """The module and, for a package, every module under it."""
    path = REPO.joinpath(*name.split("."))
    if not path.is_dir():
        return [name]
    return [name, *(m.name for m in pkgutil.walk_packages([str(path)], f"{name}."))]


def _pure_modules() -> list[str]:
    # The Kafka edge (the importers of the contract's ignored imports) may import the client.
    edge = {rule.split("->")[0].strip() for rule in PURE.get("ignore_imports", [])}
    return [m for source in PURE["source_modules"] for m in _submodules(source) if m not in edge]


def _lint_imports(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", *args], cwd=REPO, capture_output=True, text=True)


def test_import_contracts_are_kept():
    out = _lint_imports()
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_broken_import_contract_fails(tmp_path):
    # The check must be able to fail: consumers do import processors.replay, so forbidding it breaks.
    probe = tmp_path / "probe.toml"
    probe.write_text(
        '[tool.importlinter]\nroot_packages = ["schemas", "producers", "processors", "consumers", "compose"]\n'
        '[[tool.importlinter.contracts]]\nname = "probe"\ntype = "forbidden"\n'
        'source_modules = ["consumers"]\nforbidden_modules = ["processors.replay"]\n'
    )
    out = _lint_imports("--config", str(probe))
    assert out.returncode != 0 and "BROKEN" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("module", _pure_modules())
def test_pure_module_imports_no_framework(module):
    code = (
        "import importlib, json, sys\n"
        f"importlib.import_module({module!r})\n"
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({list(FRAMEWORKS)!r}))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [], f"{module} pulled in a framework"


def test_every_dialect_module_is_declared_pure_or_an_adapter():
    pure = set(_pure_modules())
    unclassified = [m for m in _submodules("producers.dialects")[1:]
                    if m not in pure and m.rpartition(".")[2] not in DIALECT_ADAPTERS]
    assert unclassified == [], "add each to the `pure` import contract (or, if it renders responses, DIALECT_ADAPTERS)"


_FOREIGN_ERRORS = """
import importlib, inspect, json, pkgutil, sys
from schemas.errors import TokentrailError
bad, broken = [], []
for package in sys.argv[1:]:
    for info in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
        if info.name.rpartition(".")[2] == "__main__":
            continue  # runs its command when imported
        try:
            module = importlib.import_module(info.name)
        except Exception as exc:
            broken.append(f"{info.name}: {exc!r}")
            continue
        for name, obj in vars(module).items():
            if (inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == module.__name__
                    and not issubclass(obj, TokentrailError)):
                bad.append(f"{module.__name__}.{name}")
print(json.dumps({"bad": sorted(bad), "broken": broken}))
"""


def test_every_exception_class_is_a_tokentrail_error():
    """Callers catch one family: each error class keeps its stdlib base and adds ``TokentrailError``."""
    out = subprocess.run([sys.executable, "-c", _FOREIGN_ERRORS, *PACKAGES], cwd=REPO, capture_output=True, text=True,
                         check=True)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["broken"] == [], "modules that do not import"
    assert found["bad"] == [], "derive these from schemas.errors.TokentrailError (keeping their stdlib base)"


@pytest.mark.parametrize("package", PACKAGES)
def test_packages_resolve_inside_the_repository(package):
    # PyPI has unrelated distributions named schemas, processors and consumers.
    out = subprocess.run(
        [sys.executable, "-c", f"import {package}; print({package}.__file__)"], cwd="/", capture_output=True, text=True,
        check=True,
    )
    assert Path(out.stdout.strip()).resolve().is_relative_to(REPO)
