"""The layout is the architecture: pure modules import no framework; packages are ours."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FRAMEWORKS = ("faust", "mode", "confluent_kafka", "aiokafka", "starlette", "httpx", "uvicorn", "fastapi",
              "aiohttp", "pydantic", "numpy", "rocksdict")


def _pure_modules() -> list[str]:
    schemas = [f"schemas.{m.name}" for m in pkgutil.iter_modules([str(REPO / "schemas")])]
    rebuild = [f"consumers.rebuild.{m.name}" for m in pkgutil.iter_modules([str(REPO / "consumers" / "rebuild")])]
    return ["schemas", *schemas, "processors.fold", "processors.lineage", "processors.state", "processors.txn",
            "processors.snapshot", "consumers.rebuild", *rebuild]


@pytest.mark.parametrize("module", _pure_modules())
def test_pure_module_imports_no_framework(module):
    code = (
        "import importlib, json, sys\n"
        f"importlib.import_module({module!r})\n"
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({list(FRAMEWORKS)!r}))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [], f"{module} pulled in a framework"


@pytest.mark.parametrize("package", ["schemas", "producers", "processors", "consumers", "compose"])
def test_packages_resolve_inside_the_repository(package):
    # PyPI has unrelated distributions named schemas, processors and consumers.
    out = subprocess.run(
        [sys.executable, "-c", f"import {package}; print({package}.__file__)"], cwd="/", capture_output=True, text=True,
        check=True,
    )
    assert Path(out.stdout.strip()).resolve().is_relative_to(REPO)


def test_runtime_packages_do_not_import_each_other():
    """producers, processors and consumers share only schemas (consumers may use processors.fold for replay)."""
    allowed = {"producers": set(), "processors": set(), "consumers": {"processors"}}
    for package, ok in allowed.items():
        for path in (REPO / package).rglob("*.py"):
            text = path.read_text()
            for other in {"producers", "processors", "consumers"} - {package} - ok:
                assert f"from {other}" not in text and f"import {other}" not in text, f"{path} imports {other}"
