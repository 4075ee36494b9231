"""Each runtime package's ``__all__`` is its public surface: every name resolves, to the object, lazily."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1].parent
# schemas.kafka has no lazy surface: a pure module must import a Kafka-edge module by name, where the
# import contracts see it.
PACKAGES = ["producers", "processors", "consumers", "consumers.sinks", "consumers.gym",
            "consumers.replay", "consumers.rebuild", "producers.dialects"]


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_name_resolves_to_an_object_not_a_submodule(package):
    module = importlib.import_module(package)
    assert module.__all__, f"{package} declares no public surface"
    for name in module.__all__:
        value = getattr(module, name)
        # A name equal to a submodule's would be shadowed by the submodule once it is imported.
        # (the dialects package names its translator modules on purpose)
        assert not isinstance(value, types.ModuleType) or name in ("anthropic", "responses", "google"), f"{package}.{name}"
    with pytest.raises(AttributeError, match=package):
        getattr(module, "no_such_name")  # noqa: B009 (the attribute access is what is tested)


@pytest.mark.parametrize("package", ["producers", "processors", "consumers", "consumers.sinks", "consumers.gym",
                                     "consumers.replay", "schemas.kafka"])
def test_importing_a_package_imports_none_of_its_modules(package):
    code = (f"import sys, json, {package}\n"
            f"print(json.dumps(sorted(m for m in sys.modules if m.startswith('{package}.'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
