"""A stored call and the fingerprint index, written and read by hand for the fold's hot path (pure).

A ``StoredCall`` (``processors.state``) is the published ``CallCaptured`` body bytes behind a small
prefix: seq, payload digest, late flag, lineage note, and copies of the call's cum_len, digest and
continuation fingerprint. ``encode_stored_call`` writes that prefix by hand and appends the body
bytes unchanged; ``read_stored_call_head`` reads the prefix without decoding the token arrays, and
``read_stored_call_link`` / ``read_stored_call_entry`` only what a child's lineage check and a
snapshot entry need. ``encode_index`` is the fingerprint index's codec by hand. All of them write and
accept exactly what ``call_codec()`` / ``index_codec()`` do (tests pin the byte equality), and read
values of an older writer schema through the codec.
"""

from __future__ import annotations

import io
from functools import cache
from typing import Any

import fastavro

from processors.avro_bytes import long_bytes, read_long, read_str, str_bytes
from processors.state import FingerprintIndex, StoredCallHead, call_codec, index_codec
from schemas.codec import MAGIC, to_avro
from schemas.records import CallCaptured

_HEADER_LEN = 10  # magic + 8-byte schema fingerprint


@cache
def _call_schema() -> dict[str, Any]:
    # The CallCaptured schema as StoredCall (and Snapshot) embed it: one parse, one source of truth.
    for f in call_codec().schema["fields"]:
        if f["name"] == "call":
            schema: dict[str, Any] = f["type"]
            return schema
    raise AssertionError("StoredCall.avsc has no call field")


def encode_call_body(call: CallCaptured) -> bytes:
    """The Avro body bytes of a call (what an event carries after its union branch)."""
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, _call_schema(), to_avro(call))
    return buf.getvalue()


def encode_stored_call(
    *, seq: int, payload_digest: str, late: bool, lineage_note: str, call: CallCaptured, body: bytes
) -> bytes:
    """``call_codec().encode(StoredCall(...))`` without re-encoding ``call``: its ``body`` bytes are appended."""
    return b"".join((
        MAGIC, call_codec().fingerprint, long_bytes(seq), str_bytes(payload_digest), b"\x01" if late else b"\x00",
        str_bytes(lineage_note), long_bytes(call.cum_len), str_bytes(call.digest),
        str_bytes(call.continuation_fingerprint), body,
    ))


def read_stored_call_head(data: bytes) -> StoredCallHead:
    """The prefix of a stored call; values from an older writer schema are decoded and re-encoded."""
    if data[2:_HEADER_LEN] != call_codec().fingerprint:
        old = call_codec().decode(data)
        data = encode_stored_call(seq=old.seq, payload_digest=old.payload_digest, late=old.late,
                                  lineage_note=old.lineage_note, call=old.call, body=encode_call_body(old.call))
    seq, pos = read_long(data, _HEADER_LEN)
    payload_digest, pos = read_str(data, pos)
    late = data[pos] == 1
    note, pos = read_str(data, pos + 1)
    cum_len, pos = read_long(data, pos)
    digest, pos = read_str(data, pos)
    fingerprint, pos = read_str(data, pos)
    return StoredCallHead(seq, payload_digest, late, note, cum_len, digest, fingerprint, memoryview(data)[pos:])


def read_stored_call_link(data: bytes) -> tuple[int, str]:
    """``(cum_len, digest)`` of a stored call (what a child's lineage is verified against), read alone."""
    if data[2:_HEADER_LEN] != call_codec().fingerprint:
        head = read_stored_call_head(data)
        return head.cum_len, head.digest
    _, pos = read_long(data, _HEADER_LEN)  # seq
    length, pos = read_long(data, pos)  # payload digest, skipped
    length, pos = read_long(data, pos + length + 1)  # after the late flag: the lineage note, skipped
    cum_len, pos = read_long(data, pos + length)
    digest, _ = read_str(data, pos)
    return cum_len, digest


def read_stored_call_entry(data: bytes) -> tuple[bool, str, memoryview]:
    """``(late, lineage_note, body)`` of a stored call: what its snapshot entry carries besides its seq."""
    if data[2:_HEADER_LEN] != call_codec().fingerprint:
        head = read_stored_call_head(data)
        return head.late, head.lineage_note, head.body
    _, pos = read_long(data, _HEADER_LEN)  # seq
    length, pos = read_long(data, pos)  # payload digest, skipped
    late = data[pos + length] == 1
    note, pos = read_str(data, pos + length + 1)
    _, pos = read_long(data, pos)  # cum_len
    for _ in range(2):  # digest, continuation fingerprint
        length, pos = read_long(data, pos)
        pos += length
    return late, note, memoryview(data)[pos:]


def encode_index(index: FingerprintIndex) -> bytes:
    """Exactly ``index_codec().encode(index)`` (an array of entries: one block, then the empty block)."""
    return encode_index_entries([(e.call_id, e.cum_len, e.digest) for e in index.entries])


def encode_index_entries(entries: list[tuple[str, int, str]]) -> bytes:
    """``encode_index`` of ``FingerprintIndex(entries=[FingerprintEntry(call_id, cum_len, digest), ...])``."""
    head = MAGIC + index_codec().fingerprint
    if not entries:
        return head + b"\x00"
    return b"".join((head, long_bytes(len(entries)),
                     *(str_bytes(call_id) + long_bytes(cum_len) + str_bytes(digest) for call_id, cum_len, digest in entries),
                     b"\x00"))
