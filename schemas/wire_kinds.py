"""How a record's lists and hashes travel in Avro ``bytes``: the codec's conversion kinds (pure).

``schemas.codec``'s conversion table names one of these for a field whose wire form is not its
record form: token ids packed as little-endian u32 (``U32``), float64 arrays (``F64``), a call's
log-probs as float32 when that is lossless, else float64 (``LOG_PROBS``), and hashes as their raw
bytes while records hold lowercase hex (``HEX``, ``HEXES``). The fold's compiled reader
(``processors.avro_reader``) recognises the same kinds, so both read a field alike.
"""

from __future__ import annotations

import sys
from array import array
from typing import Any

from schemas.errors import CodecError

__all__ = ["BIG_ENDIAN", "F64", "HEX", "HEXES", "LOG_PROBS", "U32", "HashBytes", "LogProbs", "Packed",
           "packed_log_probs"]

BIG_ENDIAN = sys.byteorder == "big"


class Packed:
    """A list of numbers carried as Avro ``bytes``: little-endian, fixed width (see the .avsc docs)."""

    def __init__(self, typecode: str) -> None:
        self.typecode = typecode

    def pack(self, values: Any) -> bytes:
        try:
            packed = array(self.typecode, values)
        except (OverflowError, TypeError) as exc:
            kind = "token ids must be integers in [0, 2**32)" if self.typecode == "I" else "log-probs must be floats"
            raise CodecError(f"cannot pack values: {kind} ({exc})") from exc
        if BIG_ENDIAN:
            packed.byteswap()
        return packed.tobytes()

    def unpack(self, data: bytes) -> list[Any]:
        values = array(self.typecode)
        values.frombytes(data)
        if BIG_ENDIAN:
            values.byteswap()
        return values.tolist()


class LogProbs(Packed):
    """A call's log-probs on the wire: float32 when every value survives the round trip, else float64.

    vLLM computes log-probs in float32 and returns them as the doubles those floats are, so its
    values always narrow losslessly (4 bytes per generated token instead of 8); any other value
    (a float64 engine, a rescaled log-prob) keeps all 64 bits. The record holds the same doubles
    either way. Two Avro ``bytes`` fields carry them, the wide one under the record's field name
    and the narrow one under ``narrow_field``; at most one is non-empty. A reader that predates the
    narrow field sees no log-probs for a call's tokens and refuses the record (the contract's
    one-log-prob-per-token check): it fails closed, never misreads float32 as float64.
    """

    narrow_typecode = "f"

    def __init__(self, narrow_field: str) -> None:
        super().__init__("d")
        self.narrow_field = narrow_field

    def pack_pair(self, values: Any) -> tuple[bytes, bytes]:
        """``(wide, narrow)``: the float64 bytes or the float32 bytes of ``values``, the other empty."""
        try:
            narrow = array("f", values)
        except TypeError as exc:
            raise CodecError(f"cannot pack values: log-probs must be floats ({exc})") from exc
        # Exact equality, value by value (a NaN never equals itself, so it stays wide; -0.0 narrows to -0.0).
        if narrow.tolist() == (values if type(values) is list else list(values)):
            if BIG_ENDIAN:
                narrow.byteswap()
            return b"", narrow.tobytes()
        return self.pack(values), b""

    def unpack_pair(self, wide: bytes, narrow: bytes) -> list[float]:
        if narrow and wide:
            raise CodecError(
                f"log-probs carried twice ({len(wide)} bytes as float64 and {len(narrow)} as float32 in "
                f"{self.narrow_field}): a writer sets exactly one; re-encode the record with schemas.codec")
        if not narrow:
            return self.unpack(wide)
        values = array("f")
        try:
            values.frombytes(narrow)
        except ValueError as exc:
            raise CodecError(f"{self.narrow_field} holds {len(narrow)} bytes, not a whole number of float32 "
                             "values; re-encode the record with schemas.codec") from exc
        if BIG_ENDIAN:
            values.byteswap()
        return values.tolist()


class HashBytes:
    """A hash carried as Avro ``bytes``: its raw bytes on the wire, lowercase hex in the record.

    A SHA-256 digest takes 33 bytes instead of 65 (issue 24: the fixed per-call facts). The record
    keeps the hex string every process compares, logs and hashes, so nothing but the codec sees the
    change. Only lowercase hex is accepted: it is what ``.hex()`` gives back, so a record decodes to
    exactly what was encoded (an upper-case or odd-length value is refused, never rewritten).
    Writers that predate the binary form wrote these fields as Avro strings; their records are read
    with a reader schema that keeps the string (``_reader_for``), and the string is the value.
    ``many``: an array of hashes.
    """

    def __init__(self, *, many: bool = False) -> None:
        self.many = many
        self.item = HashBytes() if many else None  # how each element of an array of hashes converts

    def pack(self, value: Any, cls: type, name: str) -> Any:
        try:
            if self.many:
                many = [bytes.fromhex(v) for v in value]
                if [r.hex() for r in many] == value:
                    return many
            else:
                one = bytes.fromhex(value)
                if one.hex() == value:
                    return one
        except (TypeError, ValueError):
            pass
        raise CodecError(f"{cls.__name__}.{name} must be a hash as lowercase hex (even length, 0-9a-f) or empty, "
                         f"got {value!r:.80}: compute it with schemas.hashing")

    def unpack(self, value: Any) -> Any:
        if self.many:
            return [v if type(v) is str else v.hex() for v in value]
        return value if type(value) is str else value.hex()


U32 = Packed("I")
F64 = Packed("d")
LOG_PROBS = LogProbs("generation_log_probs_f32")
HEX = HashBytes()
HEXES = HashBytes(many=True)
assert array("I").itemsize == 4 and array("d").itemsize == 8 and array("f").itemsize == 4


def packed_log_probs(values: Any) -> bytes:
    """The bytes a call's log-probs take on the wire (float32 when lossless, else float64; see ``LogProbs``)."""
    wide, narrow = LOG_PROBS.pack_pair(values)
    return wide or narrow
