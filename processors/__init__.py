"""The processor: the pure fold of rollout events into chain state, and the thin Faust shell around it.

Public surface (resolved lazily, so importing the package pulls in no framework):
``fold_raw`` / ``FoldResult`` / ``StateReader`` (the pure fold; ``fold`` itself is
``processors.fold.fold``, since a package attribute named like its submodule would be
shadowed by it), ``MemoryState`` (the in-memory state of ``processors.replay.replay``),
``ProcessorSettings`` and ``create_app`` (the Faust worker).
"""

from schemas.surface import lazy_surface

__all__, __getattr__ = lazy_surface(__name__, {
    "fold_raw": "processors.fold",
    "FoldResult": "processors.fold",
    "StateReader": "processors.fold",
    "MemoryState": "processors.replay",
    "ProcessorSettings": "processors.settings",
    "create_app": "processors.app",
})
