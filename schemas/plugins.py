"""Plugin targets: ``"module:Class"`` strings resolved to classes, refused with a ``ConfigError`` naming them.

Every plugin point (trainer sinks, dialect adapters) loads its classes here, at
startup, so a typo fails the process before any I/O, with the target, what is
wrong and the expected form, never at the first record or the first call.
"""

from __future__ import annotations

import importlib
from typing import Any

from schemas.errors import ConfigError

__all__ = ["load_class"]


def load_class(target: str, what: str) -> Any:
    """The attribute ``Class`` of module ``module`` for ``target = "module:Class"``; ``what`` names the plugin point."""
    module_name, sep, class_name = target.partition(":")
    if not sep or not module_name or not class_name or not all(p.isidentifier() for p in module_name.split(".")):
        raise ConfigError(f"{what} {target!r} must be 'module:Class' (e.g. 'mypkg.plugins:MyClass')")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"could not load {what} {target!r}: {exc}") from exc
    cls = getattr(module, class_name, None)
    if cls is None:
        raise ConfigError(f"could not load {what} {target!r}: module {module_name} has no attribute {class_name!r}")
    return cls
