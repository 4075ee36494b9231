"""A large JSON body parsed in steps, so the thread parsing it lets go of the GIL between them.

orjson parses a whole body in one C call that holds the GIL: ~0.1-0.15 s for 15 MB of short chat
messages, during which the interceptor's event loop (another thread of the same process) cannot run,
``/healthz`` included (issue 26). ``load_json_in_steps`` gives the same value, or the same error, as
``json_limits.load_json``, in C calls of about ``step`` bytes each: a request's top-level object is
walked key by key, and each top-level array value longer than ``step`` is parsed a run of whole
elements at a time. It works on the bytes: decoding a 15 MB body to one ``str`` left ~15 MB of the C heap
behind for good after each burst (the trim could not return it). Between two calls the interpreter may hand the GIL to the loop.

Guarantees:

* Every value is orjson's own reading of its bytes: the stdlib's scanner only finds where a top-level
  key or value ends (``raw_decode``, on a decoded window that grows until the value ends inside it),
  and orjson then parses exactly those bytes. Elements are parsed by
  orjson in runs: a run is the text from one element's start to a candidate ``}``, kept only if orjson
  reads it, bracketed, as an array. That proves the candidate ends an element of this array:
  a cut inside a string leaves an odd number of unescaped quotes, a cut inside a nested object or array
  leaves it unclosed, and either is not valid JSON.
* Anything else falls back to ``load_json`` on the whole body, which gives its value or raises its error
  (so a bad large body gets the 400 a small one gets): a body that is not a JSON object, invalid UTF-8,
  an escaped surrogate (orjson refuses a lone one; the stdlib's scanner would take it), a text the stdlib
  cannot walk, or an array whose elements give no valid cut within ``MAX_TRIES`` candidates.
* Each piece is parsed at the depth it has in the body (wrapped in as many arrays as it is deep), so
  orjson's depth limit refuses exactly what it refuses in the whole body.
* Linear: each run is parsed once, or up to ``MAX_TRIES`` times when candidates fall inside elements.
"""

from __future__ import annotations

import codecs
import json
import re
from typing import Any

import orjson

from producers.http.json_limits import load_json
from schemas.errors import TokentrailError

__all__ = ["MAX_TRIES", "STEP_BYTES", "load_json_in_steps"]

# One C call's share of a body: ~2 ms of orjson's time for short messages, well inside the interpreter's
# 5 ms switch interval, so the loop never waits on a parse much longer than on any other thread's turn.
STEP_BYTES = 256 << 10
# Candidate cuts tried for one run before giving up on stepping (elements with nested objects offer
# cuts inside them; each failed try costs a parse of the run).
MAX_TRIES = 16
_WINDOW = 4096  # the first decoded window a top-level value's end is looked for in (then 4x, 16x, ...)

_WS = re.compile(rb"[ \t\n\r]*")
_CUT = re.compile(rb"\}[ \t\n\r]*[,\]]")  # a '}' followed by ',' or ']': an element may end there
# orjson refuses a lone surrogate escape and the stdlib accepts it: any surrogate escape takes the whole path.
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")
_SCANNER = json.JSONDecoder()
_OPEN_OBJECT, _CLOSE_OBJECT, _OPEN_ARRAY, _CLOSE_ARRAY, _COLON, _COMMA = b"{}[]:,"


class _Fallback(TokentrailError):
    """The body cannot be parsed in steps here: ``load_json`` reads it whole (never leaves this module)."""


def load_json_in_steps(raw: bytes, what: str, step: int = STEP_BYTES) -> Any:
    """``load_json(raw, what)``: the same value or the same ValueError, parsed in steps (module docstring)."""
    if _SURROGATE.search(raw) is not None:
        return load_json(raw, what)
    try:
        return _object(raw, step)
    except (_Fallback, ValueError, IndexError, RecursionError):
        return load_json(raw, what)


def _ws(raw: bytes, i: int) -> int:
    return _WS.match(raw, i).end()  # type: ignore[union-attr]  # matches the empty string at worst


def _object(raw: bytes, step: int) -> dict[str, Any]:
    i = _ws(raw, 0)
    if raw[i] != _OPEN_OBJECT:
        raise _Fallback
    out: dict[str, Any] = {}
    i = _ws(raw, i + 1)
    if raw[i] == _CLOSE_OBJECT:
        return _end(raw, i + 1, out)
    while True:
        key, i = _value(raw, i)
        if not isinstance(key, str):
            raise _Fallback
        i = _ws(raw, i)
        if raw[i] != _COLON:
            raise _Fallback
        i = _ws(raw, i + 1)
        if raw[i] == _OPEN_ARRAY:
            out[key], i = _array(raw, i, step)
        else:
            out[key], i = _value(raw, i)
        i = _ws(raw, i)
        if raw[i] == _CLOSE_OBJECT:
            return _end(raw, i + 1, out)
        if raw[i] != _COMMA:
            raise _Fallback
        i = _ws(raw, i + 1)


def _end(raw: bytes, i: int, out: dict[str, Any]) -> dict[str, Any]:
    if _ws(raw, i) != len(raw):
        raise _Fallback  # trailing data: orjson's error
    return out


def _value(raw: bytes, i: int) -> tuple[Any, int]:
    """orjson's value of the JSON value at ``raw[i]`` and where it ends."""
    end = _value_end(raw, i)
    return orjson.loads(b"[" + raw[i:end] + b"]")[0], end  # at its own depth: orjson's depth limit holds


def _value_end(raw: bytes, i: int) -> int:
    """Where the JSON value at ``raw[i]`` ends: the stdlib's scanner on a decoded window, grown until the
    value ends inside it (a value cut by the window's edge, a number above all, could look complete)."""
    size = _WINDOW
    while True:
        whole = i + size >= len(raw)
        text = codecs.getincrementaldecoder("utf-8")().decode(raw[i:i + size], final=whole)
        try:
            _, end = _SCANNER.raw_decode(text)
        except ValueError:
            if whole:
                raise
        else:
            if end < len(text) or whole:
                return i + len(text[:end].encode("utf-8"))
        size *= 4


def _array(raw: bytes, i: int, step: int) -> tuple[list[Any], int]:
    """The array starting at ``raw[i] == '['``: its elements, parsed in runs of about ``step`` bytes."""
    out: list[Any] = []
    start = _ws(raw, i + 1)
    if raw[start] == _CLOSE_ARRAY:
        return out, start + 1
    while len(raw) - start > step:
        cut = _run(raw, start, step)
        if cut is None:
            break
        run, after = cut
        out.extend(run)
        j = _ws(raw, after)
        if raw[j] == _CLOSE_ARRAY:
            return out, j + 1
        start = _ws(raw, j + 1)  # raw[j] is ',' (the cut's own pattern)
    # The last run (or elements that offered no cut): the stdlib walks to the array's end an element at a
    # time, then orjson reads the run.
    end = _elements_end(raw, start)
    out.extend(orjson.loads(b"[[" + raw[start:end] + b"]]")[0])
    return out, end + 1


def _run(raw: bytes, start: int, step: int) -> tuple[list[Any], int] | None:
    """Whole elements from ``start`` up to a proven cut at or after ``start + step``, and the cut; None when
    no candidate within ``MAX_TRIES`` is one (the array ends sooner, or its elements nest cuts)."""
    pos = start + step
    for _ in range(MAX_TRIES):
        cut = _CUT.search(raw, pos)
        if cut is None:
            return None
        end = cut.start() + 1  # just past the '}'
        try:
            run = orjson.loads(b"[[" + raw[start:end] + b"]]")[0]
        except orjson.JSONDecodeError:
            pos = end
            continue
        return run, end
    return None


def _elements_end(raw: bytes, i: int) -> int:
    """Where the array whose element starts at ``raw[i]`` ends (its ``]``), found an element at a time."""
    while True:
        i = _ws(raw, _value_end(raw, i))
        if raw[i] == _CLOSE_ARRAY:
            return i
        if raw[i] != _COMMA:
            raise _Fallback
        i = _ws(raw, i + 1)
