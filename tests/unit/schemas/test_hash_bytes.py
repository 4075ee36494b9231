"""Hashes on the wire as raw bytes (issue 24, item 3: the fixed per-call facts).

A record holds each digest and fingerprint as lowercase hex; the wire carries its raw bytes (33 bytes
for a SHA-256 instead of 65). Encoding refuses what would not come back unchanged, records from the
writers before this change still decode to the same hex, and a golden vector pins the current bytes.
"""

from __future__ import annotations

import dataclasses
import io
import json
from importlib import resources

import fastavro
import pytest

from processors.state import call_codec
from processors.stored_call import read_stored_call_entry, read_stored_call_head
from schemas import codec, event_bytes
from schemas.errors import CodecError
from schemas.records import CallCaptured, Snapshot, SnapshotCall
from tests.factories import HASH_FIELDS, as_written_before_binary_hashes, event, finished, hashed, make_call

# The writer schemas released just before hashes went binary (archived in schemas/avro/history).
BEFORE = {"RolloutEvent": "03a4ecebdab41c21", "Snapshot": "467b9130deb81545", "StoredCall": "7e70d231fa1af2bb"}

CALL_HASHES = ("digest", "parent_digest", "request_fingerprint", "continuation_fingerprint",
               "continuation_context_digest")
FACT_HASHES = ("tool_schema_digest", "system_prompt_digest", "opening_text_digests")


def _hashed_call(**extra: object) -> CallCaptured:
    facts = {"tool_schema_digest": hashed("tools"), "system_prompt_digest": hashed("system"),
             "opening_text_digests": [hashed("open-1"), hashed("open-2")]}
    return make_call([1, 2, 3], [4, 5], call_id="c" * 32, created_at=1.5, facts=facts,
                     parent_digest=hashed("parent"), request_fingerprint=hashed("request"),
                     continuation_fingerprint=hashed("continuation"), continuation_context_len=2,
                     continuation_context_digest=hashed("context"), **extra)


def _writer(name: str) -> dict:
    path = resources.files("schemas") / "avro" / "history" / f"{name}.{BEFORE[name]}.json"
    return fastavro.parse_schema(json.loads(path.read_text()))


def _written_by(writer: dict, datum: dict) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, writer, as_written_before_binary_hashes(datum))
    return codec.MAGIC + codec._fingerprint_of(writer) + buf.getvalue()


def test_the_hash_fields_are_the_ones_the_codec_carries_as_bytes():
    assert set(CALL_HASHES) | set(FACT_HASHES) == HASH_FIELDS


def test_every_hash_round_trips_and_takes_its_raw_bytes_on_the_wire():
    call = _hashed_call()
    data = codec.encode_event(event("r", call, event_id="e" * 32, at=0))
    assert codec.decode_event(data).body == call
    # Each hash costs its 32 raw bytes (and a length byte, there either way), not 64 hex characters.
    cleared = dataclasses.replace(call, **{name: "" for name in CALL_HASHES if name != "digest"},
                                  facts=dataclasses.replace(call.facts, tool_schema_digest="", system_prompt_digest="",
                                                            opening_text_digests=[]))
    smaller = codec.encode_event(event("r", cleared, event_id="e" * 32, at=0))
    # 8 hashes cleared: 6 fields and the 2 opening digests (whose array also loses its count and 2 length bytes)
    assert len(data) - len(smaller) == 8 * 32 + 3
    for value in (hashed("continuation"), hashed("tools"), hashed("open-2")):
        assert bytes.fromhex(value) in data and value.encode() not in data


@pytest.mark.parametrize("value", ["fp1", "ABCD", "abc", "ab cd", "é0", "0x12"])
@pytest.mark.parametrize("field", ["request_fingerprint", "tool_schema_digest", "opening_text_digests"])
def test_a_hash_that_is_not_lowercase_hex_is_refused_naming_the_field_and_value(field, value):
    if field == "request_fingerprint":
        call = make_call([1], [2], request_fingerprint=value)
        where = "CallCaptured.request_fingerprint"
    else:
        call = make_call([1], [2], facts={field: [value] if field == "opening_text_digests" else value})
        where = f"CallFacts.{field}"
    with pytest.raises(CodecError, match=f"{where} must be a hash as lowercase hex") as err:
        codec.encode_event(event("r", call))
    assert repr(value) in str(err.value) and "schemas.hashing" in str(err.value)


def test_an_event_from_the_writer_before_binary_hashes_decodes_to_the_same_hex():
    call = _hashed_call()
    old = _written_by(_writer("RolloutEvent"), codec.to_avro(event("r", call, event_id="e" * 32, at=0)))
    assert old[2:10].hex() == BEFORE["RolloutEvent"]
    back = codec.decode_event(old).body
    assert back == call
    # Its body re-encodes in the current (binary) form: what the fold stores and splices.
    assert event_bytes.event_body_bytes(old) == event_bytes.event_body_bytes(codec.encode_event(event("r", call)))


def test_a_snapshot_from_the_writer_before_binary_hashes_decodes_to_the_same_hex():
    call = _hashed_call()
    snapshot = Snapshot(snapshot_id="s" * 32, rollout_id="r", version=1, frozen_at=5, calls=[SnapshotCall(seq=0, call=call)],
                        incomplete=False, incomplete_markers=[], finished=finished())
    back = codec.decode_snapshot(_written_by(_writer("Snapshot"), codec.to_avro(snapshot)))
    assert back.calls[0].call == call


def test_a_stored_call_from_the_writer_before_binary_hashes_reads_and_rewrites_its_body():
    call = _hashed_call()
    datum = {"seq": 4, "payload_digest": "p" * 64, "late": False, "lineage_note": "verified", "cum_len": call.cum_len,
             "digest": call.digest, "continuation_fingerprint": call.continuation_fingerprint,
             "call": codec.to_avro(call)}
    old = _written_by(_writer("StoredCall"), datum)
    assert call_codec().decode(old).call == call
    head = read_stored_call_head(old)
    assert (head.seq, head.digest, head.continuation_fingerprint) == (4, call.digest, call.continuation_fingerprint)
    # The body the fold splices into a snapshot is the current writer's, so the snapshot decodes.
    _, _, body = read_stored_call_entry(old)
    assert bytes(body) == event_bytes.event_body_bytes(codec.encode_event(event("r", call)))


# One CallCaptured event as the current writer encodes it. Readers must decode it for as long as its
# writer schema is archived; a change to the wire form changes these bytes (archive, then re-pin).
GOLDEN = bytes.fromhex(
    "c301852cc6167dd31e2f4065656565656565656565656565656565656565656565656565656565656565651c676f6c64656e2d726f6c6c6f"
    "75748080f2818389850608746573740200406363636363636363636363636363636363636363636363636363636363636363000000000000"
    "f83f0018010000000200000003000000001004000000050000000010000000bf0000a0bfbc015b7b2274797065223a20226d657373616765"
    "222c2022726f6c65223a2022617373697374616e74222c2022636f6e74656e74223a205b7b2274797065223a20226f75747075745f746578"
    "74222c202274657874223a20226f6b227d5d7d5d0200000000000a40f9621b3ed7fd0071bfc930ba0ed1ee53f9c21e6a3a4a251c9d6f145b"
    "5fbe8b1840e47125968b3b71049fbc4802d1e40a71ea1359decfabacf70b34588037d4ff0c401f58b9145b24d108d7ac38887338b3ea3229"
    "833b9c1e418250343f907bfd10474018274cfeeec1ebac0e05d2da68131f6e20e9b2ac52d9320ba06a8236e75117890440ea7792a26f405e"
    "2ae9c6f49ca93bbe6076ceac0a1fc53d83426c7d7f2d9377e4020000000006282f76312f636861742f636f6d706c6574696f6e73000c706f"
    "6c696379000040f9d35d43770d39092a663e665e82ae1d84a9e0da3d0d10c407acada6a40cd28140bbc5e661e106c6dcd8dc6dd186454c2f"
    "cba3c710fb4d8e71a60c93eaf077f07300047b7d00000000000000000000044074980e4294d91893154ac755800514aa3ddecfec3de64f72"
    "7450e3f122de72c740cc8383fd582707c980763978f765282064e28cd0d89be75b32ca5eb62b2e0da700000000000000"
)


def _golden_event():
    return event("golden-rollout", _hashed_call(log_probs=[-0.5, -1.25]), event_id="e" * 32, at=0)


def test_the_golden_event_is_what_the_current_writer_encodes_and_decodes_back():
    assert codec.encode_event(_golden_event()) == GOLDEN
    assert codec.decode_event(GOLDEN) == _golden_event()
