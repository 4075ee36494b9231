"""The state's hand-written Avro (hot path) is byte-for-byte the codec's, and older writers still read."""

from __future__ import annotations

import io
import json
from importlib import resources

import fastavro
import pytest
from fastavro.schema import to_parsing_canonical_form
from hypothesis import given, settings
from hypothesis import strategies as st

from processors.avro_bytes import long_bytes, read_long, read_str, str_bytes
from processors.state import (
    FingerprintEntry,
    FingerprintIndex,
    RolloutHeader,
    StoredCall,
    StoredIncomplete,
    call_codec,
    header_codec,
    incomplete_codec,
    index_codec,
)
from processors.stored_call import (
    encode_call_body,
    encode_index,
    encode_stored_call,
    read_stored_call_entry,
    read_stored_call_head,
    read_stored_call_link,
)
from schemas.codec import MAGIC, _fingerprint_of, event_codec, snapshot_codec, to_avro
from schemas.errors import CodecError
from schemas.event_bytes import avro_long, avro_string
from schemas.records import CallIncomplete
from tests.factories import as_written_before_binary_hashes, hashed, make_call


@settings(max_examples=200, deadline=None)
@given(st.integers(-(2**63), 2**63 - 1))
def test_avro_long_is_zigzag_varint(n):
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, "long", n)
    assert avro_long(n) == long_bytes(n) == buf.getvalue()
    assert read_long(avro_long(n), 0) == (n, len(avro_long(n)))


def test_the_hand_primitives_are_the_codecs_over_their_whole_table_and_beyond_it():
    for n in range(-200, 20_000):
        raw = avro_long(n)
        assert long_bytes(n) == raw and read_long(raw + b"\x00", 0) == (n, len(raw))
    for text in ("", "a", "é" * 40, "x" * 70, "y" * 9000):
        raw = avro_string(text)
        assert str_bytes(text) == raw and read_str(raw + b"\x01", 0) == (text, len(raw))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.text(max_size=40), st.integers(-(2**63), 2**63 - 1), st.text(max_size=70)), max_size=4))
def test_a_fingerprint_index_is_exactly_what_the_codec_writes(entries):
    index = FingerprintIndex(entries=[FingerprintEntry(call_id=c, cum_len=n, digest=d) for c, n, d in entries])
    assert encode_index(index) == index_codec().encode(index)
    assert index_codec().decode(encode_index(index)) == index


@settings(max_examples=100, deadline=None)
@given(seq=st.integers(0, 2**31 - 1), late=st.booleans(), note=st.text(max_size=40),
       prompt=st.lists(st.integers(0, 2**32 - 1), max_size=30), fingerprint=st.binary(max_size=35).map(bytes.hex))
def test_a_stored_call_is_exactly_what_the_codec_writes_and_its_head_reads_back(seq, late, note, prompt, fingerprint):
    call = make_call(prompt, [7, 8], continuation_fingerprint=fingerprint)
    record = StoredCall(seq=seq, payload_digest="d" * 64, call=call, late=late, lineage_note=note,
                        cum_len=call.cum_len, digest=call.digest, continuation_fingerprint=fingerprint)
    fast = encode_stored_call(seq=seq, payload_digest="d" * 64, late=late, lineage_note=note, call=call,
                              body=encode_call_body(call))
    assert fast == call_codec().encode(record)
    head = read_stored_call_head(fast)
    assert (head.seq, head.late, head.lineage_note, head.cum_len, head.digest, head.continuation_fingerprint) == (
        seq, late, note, call.cum_len, call.digest, fingerprint)
    assert bytes(head.body) == encode_call_body(call)
    assert read_stored_call_link(fast) == (call.cum_len, call.digest)
    late_read, note_read, body = read_stored_call_entry(fast)
    assert (late_read, note_read, bytes(body)) == (late, note, encode_call_body(call))


def _older_stored_call_schemas() -> list:
    history = resources.files("schemas") / "avro" / "history"
    current = call_codec().fingerprint.hex()
    return [json.loads(f.read_text()) for f in history.iterdir()
            if f.name.startswith("StoredCall.") and current not in f.name]


@pytest.mark.parametrize("old_schema", _older_stored_call_schemas() or [None])
def test_a_stored_call_from_an_older_writer_schema_still_reads(old_schema):
    if old_schema is None:
        pytest.skip("no older StoredCall writer schema is archived")
    if "continuation_fingerprint" in {f["name"] for f in old_schema["fields"]}:
        pytest.skip("this archived writer already has the head fields")
    parsed = fastavro.parse_schema(old_schema)
    # A log-prob that is not a float32 value: it stays in the float64 field every writer has.
    call = make_call([1, 2, 3], [4], continuation_fingerprint=hashed("fp-old"), log_probs=[-0.1])
    buf = io.BytesIO()
    datum = {"seq": 3, "payload_digest": "p" * 64, "late": True, "lineage_note": "verified",
             "call": as_written_before_binary_hashes(to_avro(call))}
    fastavro.schemaless_writer(buf, parsed, datum)
    data = MAGIC + _fingerprint_of(parsed) + buf.getvalue()
    head = read_stored_call_head(data)
    assert (head.seq, head.late, head.cum_len, head.digest, head.continuation_fingerprint) == (
        3, True, call.cum_len, call.digest, hashed("fp-old"))
    assert read_stored_call_link(data) == (call.cum_len, call.digest)
    assert read_stored_call_entry(data)[:2] == (True, "verified")
    assert call_codec().decode(data).call == call


def test_every_state_record_refuses_bytes_after_its_body():
    # Item 5 (issue 15): the state is plain Avro, so its decoders refuse trailing bytes like the contract's.
    call = make_call([1, 2], [3])
    cases = [
        (header_codec(), RolloutHeader(rollout_id="r-state", version=2)),
        (call_codec(), StoredCall(seq=0, payload_digest="d" * 64, call=call, cum_len=call.cum_len, digest=call.digest)),
        (index_codec(), FingerprintIndex(entries=[FingerprintEntry(call_id="c" * 32, cum_len=3, digest="x")])),
        (incomplete_codec(), StoredIncomplete(event_id="ev-s", marker=CallIncomplete(reason="upstream_error"))),
    ]
    for codec, record in cases:
        data = codec.encode(record)
        assert codec.decode(data) == record
        with pytest.raises(CodecError, match=rf"{codec.schema_name}.* has 1 byte\(s\) after its Avro body"):
            codec.decode(data + b"\x00")


def _call_branch(schema, *path: str):
    for name in path:
        schema = next(f["type"] for f in schema["fields"] if f["name"] == name)
        if isinstance(schema, dict) and schema.get("type") == "array":
            schema = schema["items"]
    return schema


def test_the_call_body_bytes_the_fold_stores_and_the_snapshot_splices_have_one_schema():
    # The fold stores an event's CallCaptured body bytes as they are and the snapshot splices them:
    # that is only decodable while the event, StoredCall and Snapshot embed the very same schema.
    event_branch = next(b for b in _call_branch(event_codec().schema, "body")
                        if isinstance(b, dict) and b.get("name") == "tokentrail.CallCaptured")
    stored = _call_branch(call_codec().schema, "call")
    spliced = _call_branch(_call_branch(snapshot_codec().schema, "calls"), "call")
    forms = {to_parsing_canonical_form(schema) for schema in (event_branch, stored, spliced)}
    assert len(forms) == 1, forms
