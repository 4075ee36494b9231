"""The layout is the architecture (ARCHITECTURE §3), and these tests make it fail loudly.

- Import contracts: ``[tool.importlinter]`` in pyproject.toml, run here with ``lint-imports``
  (a real import graph, not substrings): schemas imports none of our packages; producers,
  processors and consumers share only schemas (consumers reach processors only through
  ``processors.fold`` and ``processors.replay``); nothing but compose imports compose, whose
  roles are layered; pure modules import no framework, directly or through another module.
- The contracts can fail: every forbidden import, appended to a scratch copy of a real pure
  module, breaks them (and so does a pure module reaching the Kafka client through the edge).
- Pure modules, again in a fresh interpreter: ``sys.modules`` after importing each one holds
  no framework, which also catches imports done at import time through ``importlib``.
  The list is the ``pure`` contract's, so there is one list.
- One exception hierarchy: every exception class the packages define is a ``TokentrailError``.
- Each package resolves inside the repository (PyPI has unrelated ``schemas`` etc.).
"""

from __future__ import annotations

import json
import pkgutil
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("schemas", "producers", "processors", "consumers", "compose")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
# Dialect modules that render HTTP responses (starlette); every other dialect module must be pure.
DIALECT_ADAPTERS = {"chat", "anthropic_adapter", "responses_adapter", "google_adapter"}


def _contracts() -> dict[str, dict]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {c["id"]: c for c in config["contracts"]}


PURE = _contracts()["pure"]
# What a fresh interpreter must not hold after importing a pure module: the contract's third-party names
# (the standard library loads urllib and http for itself, e.g. pathlib does; the static contract checks those).
FRAMEWORKS = tuple(m for m in PURE["forbidden_modules"] if m not in sys.stdlib_module_names)


def _submodules(name: str) -> list[str]:
    """The module and, for a package, every module under it."""
    path = REPO.joinpath(*name.split("."))
    if not path.is_dir():
        return [name]
    return [name, *(m.name for m in pkgutil.walk_packages([str(path)], f"{name}."))]


def _pure_modules() -> list[str]:
    return [m for source in PURE["source_modules"] for m in _submodules(source)]


def _lint_imports(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", *args], cwd=REPO, capture_output=True, text=True)


def test_import_contracts_are_kept():
    out = _lint_imports()
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_schemas_module_is_pure_or_the_kafka_edge():
    """A module added to schemas is checked by one of the two contracts, never by neither."""
    edge = set(_contracts()["kafka-edge"]["source_modules"])
    pure = set(_pure_modules())
    unclassified = [m for m in _submodules("schemas") if m not in pure | edge and m.rpartition(".")[2] != "__init__"
                    and m not in ("schemas", "schemas.kafka")]
    assert unclassified == [], "list each in the `pure` contract (or, if it imports confluent_kafka, in `kafka-edge`)"
    assert not pure & edge


# A real pure module; its scratch copy gets every forbidden import appended.
_MUTANT = "producers/capture/events.py"
# What no pure module may import, stated here independently of pyproject.toml, so that dropping a name
# from the contract fails this test: frameworks and Kafka clients, network clients (the standard
# library's too), state stores, serving and ML libraries, the rig's SDKs and tools.
MUST_FORBID = ("faust", "mode", "confluent_kafka", "aiokafka", "starlette", "fastapi", "uvicorn", "httpx", "httpcore",
               "aiohttp", "requests", "urllib", "http", "pydantic", "numpy", "torch", "rocksdict", "prometheus_client",
               "orjson", "vllm", "transformers", "safetensors", "openai", "anthropic", "tqdm", "yaml")


def test_each_forbidden_import_in_a_pure_module_breaks_the_contracts(tmp_path):
    """A scratch copy of the tree, one pure module importing each forbidden module: lint-imports, on the real
    contracts, must refuse every one of them, and a function-level reach into the Kafka edge too."""
    for package in PACKAGES:
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    mutant = tmp_path / _MUTANT
    lines = [f"import {name}" for name in MUST_FORBID]
    lines += ["", "", "def _sneak():", "    from schemas.kafka.bridge import AckedProducer", "    return AckedProducer"]
    mutant.write_text(mutant.read_text() + "\n" + "\n".join(lines) + "\n")
    out = subprocess.run([str(LINT_IMPORTS), "--no-cache", "--contract", "pure"], cwd=tmp_path, capture_output=True,
                         text=True)
    assert out.returncode != 0 and "BROKEN" in out.stdout, out.stdout + out.stderr
    module = _MUTANT.removesuffix(".py").replace("/", ".")
    report = " ".join(out.stdout.split())  # lint-imports wraps long lines
    missed = [name for name in MUST_FORBID if f"{module} -> {name}" not in report]
    assert missed == [], f"forbidden imports the contracts let through: {missed}\n{out.stdout}"
    assert f"{module} -> schemas.kafka.bridge" in report, out.stdout  # the edge is no way round


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


# Modules that run only inside vLLM's own environment (.venv-vllm: torch, vllm), loaded by the engine.
VLLM_SIDE = ("compose.engines.vllm_rig.paced_decode",)

_FOREIGN_ERRORS = """
import importlib, inspect, json, pkgutil, sys
from schemas.errors import TokentrailError
bad, broken = [], []
vllm_side = set(sys.argv[1].split(","))
for package in sys.argv[2:]:
    for info in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
        if info.name.rpartition(".")[2] == "__main__":
            continue  # runs its command when imported
        if info.name in vllm_side:
            continue  # imports vLLM, absent here
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
    out = subprocess.run([sys.executable, "-c", _FOREIGN_ERRORS, ",".join(VLLM_SIDE), *PACKAGES], cwd=REPO,
                         capture_output=True, text=True, check=True)
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
