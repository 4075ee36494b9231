"""The pinned faust still has every private name the Faust shell relies on.

``processors.delivery.FAUST_PRIVATE_NAMES`` is the one list; these tests check each name on the
real faust classes (not the fakes the other shell tests use), and that the shell's source
touches or overrides no private faust name the list lacks.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

import processors.app
import processors.delivery
import processors.fold_loop
import processors.guard
import processors.intake
from processors.delivery import FAUST_PRIVATE_NAMES

SHELL = (processors.app, processors.delivery, processors.fold_loop, processors.guard, processors.intake)


def _resolve(dotted: str) -> type:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _has(cls: type, name: str) -> bool:
    """A class attribute or method, or an instance attribute its ``__init__`` assigns."""
    if hasattr(cls, name):
        return True
    return any(f"self.{name} =" in inspect.getsource(klass.__init__)
               for klass in cls.__mro__ if inspect.isfunction(vars(klass).get("__init__")))


@pytest.mark.parametrize(("owner", "name"), FAUST_PRIVATE_NAMES, ids=lambda v: v)
def test_pinned_faust_has_the_private_name(owner, name):
    assert _has(_resolve(owner), name), f"{owner}.{name} is gone from the pinned faust: update the shell"


def test_a_missing_name_is_caught():
    from faust.transport.consumer import Consumer
    assert not _has(Consumer, "_no_such_private_name")


def _private(name: str) -> bool:
    # _abc_impl: every ABC subclass gets its own (abc's bookkeeping, not faust's)
    return name.startswith("_") and not name.startswith("__") and name != "_abc_impl"


def test_the_shell_touches_no_unlisted_private_faust_name():
    listed = {name for _, name in FAUST_PRIVATE_NAMES}
    used: set[str] = set()
    for module in SHELL:
        for node in ast.walk(ast.parse(Path(module.__file__).read_text())):
            # obj._x on anything but our own self/cls: a faust object's private attribute
            if (isinstance(node, ast.Attribute) and _private(node.attr)
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
                used.add(node.attr)
        # a private method a subclass of a faust class defines over the faust base's
        for cls in vars(module).values():
            if inspect.isclass(cls) and cls.__module__ == module.__name__:
                faust_bases = [b for b in cls.__mro__[1:] if b.__module__.split(".")[0] in ("faust", "mode")]
                used |= {name for name in vars(cls) if _private(name) and any(hasattr(b, name) for b in faust_bases)}
    assert used <= listed, f"add {sorted(used - listed)} to processors.delivery.FAUST_PRIVATE_NAMES"
