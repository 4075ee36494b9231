"""The C heap's free pages handed back to the OS after a burst (glibc's ``malloc_trim``).

CPython gives its own arenas back, but what C code malloc'd (librdkafka's queued records and fetch
buffers, a large body's parse) goes back to glibc, which keeps free pages inside its arenas mapped: after
a burst the process's RSS stays where the burst left it. ``malloc_trim(0)`` releases them from every
arena (glibc 2.8 and later). Two bursts call it: the last large request body of a busy moment
(``producers.call.large_bodies``) and a drained spool after a broker outage
(``producers.capture.durable``); nothing per call does.

Guarantees: ``trim`` never raises, and returns False where the C library has no ``malloc_trim`` (another
libc). A ctypes call releases the GIL, so a worker thread runs it, never the event loop.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from typing import cast

__all__ = ["AVAILABLE", "trim"]


def _libc_malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        malloc_trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    malloc_trim.argtypes = [ctypes.c_size_t]
    malloc_trim.restype = ctypes.c_int
    return cast("Callable[[int], int]", malloc_trim)


_MALLOC_TRIM = _libc_malloc_trim()
AVAILABLE = _MALLOC_TRIM is not None


def trim() -> bool:
    """Release the C heap's free pages; False where there is no ``malloc_trim``."""
    if _MALLOC_TRIM is None:
        return False
    _MALLOC_TRIM(0)
    return True
