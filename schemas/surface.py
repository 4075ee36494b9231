"""Public surfaces of tokentrail's packages, resolved lazily (PEP 562).

A package's ``__init__`` names its public API in one table, ``{name: module}``, and
gets its ``__all__`` and module ``__getattr__`` from ``lazy_surface``. Guarantees: a
name is imported from its module only when it is first asked for, so importing a
package (``consumers`` on the way to the pure ``consumers.rebuild``, ``producers`` on
the way to the pure dialect translators) pulls in no framework; a name the table does
not hold is an ``AttributeError`` naming the package, as for any module.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_surface"]


def lazy_surface(package: str, exports: Mapping[str, str]) -> tuple[list[str], Callable[[str], Any]]:
    """``(__all__, __getattr__)`` for ``package``, whose public names live in the modules ``exports`` maps them to."""
    table = dict(exports)

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return sorted(table), __getattr__
