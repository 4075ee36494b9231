"""Compact JSON text for the rebuilt record and its projection (pure): one encoder, token arrays as fragments.

Guarantee: every function here returns exactly the text that
``json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)``
returns for the same value (``ValueError`` for a non-finite float, as it does), so
a record's bytes never depend on which path wrote them; the paths differ only in
cost. The record's bulk is a trajectory's arrays (a token id, a mask byte, a log-prob
per token) and the projection's copies of them:

- ``dumps``: one shared encoder. ``json.dumps`` with options builds a new
  ``JSONEncoder`` on every call, which the projection would pay per output item.
- ``bit_list``: a loss mask of 0/1 bytes as ``[0,1,...]`` from C-level byte
  operations, instead of one Python int, and its formatting, per token.
- ``id_run``: token ids as the bare ``1,2,3`` run the projection splices into
  every running prompt that repeats them (formatted once, referenced after).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["bit_list", "dumps", "id_run"]

# The encoder keeps no state between calls (each encode builds its own), so one serves every thread.
dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode

_BIT_DIGITS = bytes.maketrans(b"\x00\x01", b"01")


def bit_list(mask: Any) -> str:
    """``dumps(list(mask))`` for a ``bytes`` loss mask; linear in bytes with no per-byte Python object."""
    if not isinstance(mask, (bytes, bytearray)) or mask.translate(None, b"\x00\x01"):
        return dumps(list(mask))  # not bytes, or a byte other than 0 and 1: the general path
    n = len(mask)
    if not n:
        return "[]"
    # "[d,d,...,d]": the digits at the odd offsets, commas between them, brackets at the ends.
    text = bytearray(b",") * (2 * n + 1)
    text[0], text[-1] = 0x5B, 0x5D  # "[", "]"
    text[1::2] = mask.translate(_BIT_DIGITS)
    return text.decode("ascii")


def id_run(ids: list[int]) -> str:
    """The ids as ``1,2,3``: ``",".join(map(str, ids))``, the inside of their JSON list.

    One ``%`` format of the whole run: ``%s`` is ``str`` of each id written straight into
    the result, where ``join(map(str, ...))`` calls the ``str`` type per id (about 1.7x the cost).
    """
    return ("%s," * len(ids))[:-1] % tuple(ids)
