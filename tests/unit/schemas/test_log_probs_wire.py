"""Log-probs on the wire (issue 24, item 3): float32 when that is lossless, float64 otherwise.

vLLM computes log-probs in float32 and returns the doubles those floats are; carried as float32
they cost 4 bytes per generated token instead of 8 and widen back to the same doubles bit for bit.
Anything that is not exactly a float32 keeps its 64 bits. Old readers fail closed on narrowed
records; old records decode as before (the archived-writer tests in test_schema_evolution.py).
"""

from __future__ import annotations

import io
import json
import math
import struct
from importlib import resources

import fastavro
import pytest

from schemas import codec, wire_kinds
from schemas.errors import CodecError, ContractError
from tests.factories import event, make_call

# An event as the writer of issue 24 encoded it (RolloutEvent.08fd36ff1b25278b, archived): ids 4, 5, 6 with log-probs -0.5, -1.25, -2**-10 as float32
# (the 12 bytes 000000bf 0000a0bf 000080ba after the empty float64 field). It must decode to the
# same doubles for as long as its writer schema is archived.
GOLDEN = bytes.fromhex(
    "c30108fd36ff1b25278b4065763030303030303030303030303030303030303030303030303030303030311c676f6c64656e2d726f6c6c6f75748280f28183898506087465737402004030303030303030303030303030303030303030303030303030303030303030300000000000000000001801000000020000000300000000180400000005000000060000000018000000bf0000a0bf000080babc015b7b2274797065223a20226d657373616765222c2022726f6c65223a2022617373697374616e74222c2022636f6e74656e74223a205b7b2274797065223a20226f75747075745f74657874222c202274657874223a20226f6b227d5d7d5d0200000000000c80013163386335366531363761613631373136623763636466613737636163663832666230656461306537336530396364656266666638396637336537333862656400000000000200000006282f76312f636861742f636f6d706c6574696f6e73000c706f6c6963790000000000047b7d0000000000000000000000000000000000"
)
GOLDEN_LOG_PROBS = [-0.5, -1.25, -0.0009765625]


def _f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def test_the_golden_event_decodes_to_the_engines_doubles():
    call = codec.decode_event(GOLDEN).body
    assert call.generation_token_ids == [4, 5, 6]
    assert [x.hex() for x in call.generation_log_probs] == [x.hex() for x in GOLDEN_LOG_PROBS]
    assert bytes.fromhex("000000bf0000a0bf000080ba") in GOLDEN


def test_float32_values_travel_in_4_bytes_and_widen_back_bit_for_bit():
    values = [_f32(-0.1 * k - 1e-7) for k in range(512)]  # what vLLM's float32 log-probs look like as JSON doubles
    wide, narrow = wire_kinds.LOG_PROBS.pack_pair(values)
    assert (wide, len(narrow)) == (b"", 4 * 512)
    back = codec.decode_event(codec.encode_event(event("r", make_call([1], list(range(512)), log_probs=values))))
    assert [x.hex() for x in back.body.generation_log_probs] == [x.hex() for x in values]
    as_doubles = make_call([1], list(range(512)), log_probs=[v - 1e-12 for v in values])  # not float32 values
    assert len(codec.encode_event(event("r", as_doubles))) - len(codec.encode_event(event("r", back.body))) == 4 * 512


@pytest.mark.parametrize("value", [-0.1, -1e-300, -1e300, -(2.0**-149) / 3, float("nan")])
def test_a_value_that_is_not_a_float32_keeps_all_64_bits(value):
    wide, narrow = wire_kinds.LOG_PROBS.pack_pair([-0.5, value])
    assert narrow == b"" and len(wide) == 16
    back = codec.decode_event(codec.encode_event(event("r", make_call([1], [2, 3], log_probs=[-0.5, value]))))
    got = back.body.generation_log_probs[1]
    assert math.isnan(got) if math.isnan(value) else got.hex() == value.hex()


@pytest.mark.parametrize("value", [-0.0, -math.inf, -(2.0**-149), -3.4028234663852886e38])
def test_float32_edge_values_narrow_exactly(value):
    _, narrow = wire_kinds.LOG_PROBS.pack_pair([value])
    assert len(narrow) == 4
    back = codec.decode_event(codec.encode_event(event("r", make_call([1], [2], log_probs=[value])))).body
    assert back.generation_log_probs[0].hex() == value.hex() and math.copysign(1, back.generation_log_probs[0]) == -1


def test_log_probs_carried_twice_are_refused_naming_the_field():
    datum = codec.to_avro(event("r", make_call([1], [2], log_probs=[-0.5])))
    datum["body"][1]["generation_log_probs"] = struct.pack("<d", -0.5)
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, codec.event_codec().schema, datum)
    with pytest.raises(CodecError, match="generation_log_probs_f32"):
        codec.decode_event(codec.MAGIC + codec.event_codec().fingerprint + buf.getvalue())


def test_a_reader_without_the_float32_field_refuses_a_narrowed_call_instead_of_misreading_it():
    history = resources.files("schemas") / "avro" / "history"
    older = [json.loads(f.read_text()) for f in sorted(history.iterdir(), key=lambda f: f.name)
             if f.name.startswith("RolloutEvent.") and "generation_log_probs_f32" not in f.read_text()]
    old_reader = fastavro.parse_schema(older[-1])
    body = io.BytesIO(GOLDEN[10:])
    golden_writer = fastavro.parse_schema(json.loads((history / f"RolloutEvent.{GOLDEN[2:10].hex()}.json").read_text()))
    datum = fastavro.schemaless_reader(body, golden_writer, old_reader, return_record_name=True,
                                       return_record_name_override=True)
    with pytest.raises(ContractError, match="generation_log_probs has 0 values for 3"):
        codec.from_avro(type(codec.decode_event(GOLDEN)), datum)
