"""``decode_for_fold`` is ``decode_event_with_body``, faster: the same event and body bytes, or the same error.

Compared over valid events of every body type, the event-topic fuzz tier's corrupted records and
absurd events, every truncation and bit flips of real captures; and the compiled CallCaptured reader
against fastavro + ``from_avro`` on the records hypothesis builds. The fast path must also be the one
taken for ordinary captures, or these tests would compare the full decode with itself.
"""

from __future__ import annotations

import io
import re

import fastavro
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processors import decode
from processors.avro_reader import Unsupported, compile_reader
from processors.decode import decode_for_fold
from schemas.codec import encode_event, event_codec, from_avro, to_avro
from schemas.event_bytes import decode_event_with_body, event_body_bytes
from schemas.hashing import compute_digest
from schemas.records import CallCaptured, CallFacts, Dialect, ParentResolution, VersionSpan
from tests.factories import event, finished, incomplete, retire, started
from tests.unit.processors.fuzz_events_strategies import VICTIM_RECORDS, absurd_events, corruptions


def outcome(decoder, value):
    """What a decoder makes of ``value``, comparable across decoders (token views and lists alike)."""
    try:
        ev, body = decoder(value)
    except Exception as exc:  # fastavro's messages name its stream object by address: not the decoder's choice
        return ("error", type(exc).__name__, re.sub(r" at 0x[0-9a-f]+", " at 0x...", str(exc)))
    return ("event", type(ev.body).__name__, repr(to_avro(ev)), bytes(body))


def assert_same(value):
    assert outcome(decode_for_fold, value) == outcome(decode_event_with_body, value)


CAPTURES = [v for _, v in VICTIM_RECORDS if decode_event_with_body(v)[0].body.__class__ is CallCaptured]


def test_captures_take_the_fast_path_and_other_bodies_the_full_decode():
    assert CAPTURES and all(decode._fast(v) is not None for v in CAPTURES)
    for body in (finished({"reward": 1.0}), incomplete("c" * 32), retire("s" * 32, 3), started("c" * 32)):
        value = encode_event(event("r-1", body))
        assert decode._fast(value) is None
        assert_same(value)


@pytest.mark.parametrize("value", CAPTURES)
def test_a_capture_decodes_to_the_same_event_and_body_bytes(value):
    fast, body = decode_for_fold(value)
    full, full_body = decode_event_with_body(value)
    assert body == full_body == event_body_bytes(value)
    assert list(fast.body.prompt_token_ids) == full.body.prompt_token_ids
    assert fast.body.generation_log_probs.tolist() == full.body.generation_log_probs
    assert fast.body.facts == full.body.facts and fast.body.parent_resolution is full.body.parent_resolution
    assert encode_event(fast) == encode_event(full) == value


def test_every_truncation_and_bit_flip_of_a_capture_decodes_or_fails_the_same():
    value = CAPTURES[-1]
    for end in range(len(value)):
        assert_same(value[:end])
    for at in range(10, len(value), 7):
        for bit in (0, 3, 7):
            flipped = bytearray(value)
            flipped[at] ^= 1 << bit
            assert_same(bytes(flipped))
    assert_same(value + b"\x00")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corruptions())
def test_corrupted_records_decode_or_fail_the_same(corruption):
    _, _, value, _, _ = corruption
    if isinstance(value, bytes):
        assert_same(value)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(absurd_events())
def test_absurd_events_decode_or_fail_the_same(absurd):
    _, value, _ = absurd
    assert_same(value)


def test_what_the_reader_does_not_mirror_is_left_to_fastavro():
    """fastavro reads a boolean byte 2 as True and wraps a negative enum index like a list index."""
    value = bytearray(CAPTURES[0])
    pos = len(value) - len(event_body_bytes(bytes(value)))
    read = decode._plan().read
    call, _ = read(bytes(value), memoryview(bytes(value)), pos)
    assert call.prompt_is_delta in (True, False)
    # prompt_is_delta follows model_call_id (string), created_at (double), model (string), prompt_token_ids (bytes)
    at = pos + 1 + 32 + 8 + 1
    n = value[at] >> 1
    at += 1 + n if n < 64 else 2 + n
    assert value[at] in (0, 1)
    value[at] = 2
    with pytest.raises(Unsupported):
        read(bytes(value), memoryview(bytes(value)), pos)
    assert decode._fast(bytes(value)) is None
    assert_same(bytes(value))


_TEXT = st.text(max_size=20)
_HASH = st.binary(max_size=40).map(bytes.hex)  # a hash field holds lowercase hex of any length (HashBytes)
# float32 values (what vLLM returns: carried narrow) and any double (carried wide)
_LOG_PROB = st.one_of(st.floats(width=32, allow_nan=False), st.floats(allow_nan=False))
_IDS = st.lists(st.integers(0, 2**32 - 1), max_size=20)


@st.composite
def calls(draw):
    prompt, gen = draw(_IDS), draw(_IDS)
    facts = CallFacts(route=draw(_TEXT), dialect=draw(st.sampled_from(list(Dialect))), streamed=draw(st.booleans()),
                      max_tokens=draw(st.one_of(st.none(), st.integers(-2**31, 2**31 - 1))),
                      opening_text_digests=draw(st.lists(_HASH, max_size=3)),
                      tool_schema_digest=draw(_HASH),
                      version_spans=[VersionSpan(version=v, start=s, end=s + 1)
                                     for v, s in draw(st.lists(st.tuples(_TEXT, st.integers(0, 10**6)), max_size=3))],
                      policy_version=draw(st.one_of(st.none(), _TEXT)), continued=draw(st.integers(0, 2**31 - 1)))
    resolution = draw(st.sampled_from(list(ParentResolution)))
    return CallCaptured(
        model_call_id=draw(_TEXT), created_at=draw(st.floats(allow_nan=False)), prompt_token_ids=prompt,
        generation_token_ids=gen, generation_log_probs=[draw(_LOG_PROB) for _ in gen],
        parent_resolution=resolution, cum_len=len(prompt) + len(gen), digest=compute_digest(prompt + gen),
        facts=facts, parent_call_id="p" * 32 if resolution is ParentResolution.RESOLVED else None,
        token_item_index=draw(st.one_of(st.none(), st.integers(-2**31, 2**31 - 1))),
        routed_experts_json=draw(st.one_of(st.none(), _TEXT)), finish_reason=draw(_TEXT),
        output_items_json=draw(_TEXT), request_fingerprint=draw(_HASH), prefix_supplied=draw(st.booleans()),
        continuation_fingerprint=draw(_HASH), parent_digest=draw(_HASH),
    )


@settings(max_examples=200, deadline=None)
@given(calls())
def test_the_compiled_reader_builds_what_from_avro_builds(call):
    schema = event_codec().schema
    named = schema["__named_schemas"]
    read = compile_reader("tokentrail.CallCaptured", named, CallCaptured)
    parsed = fastavro.parse_schema(named["tokentrail.CallCaptured"], named_schemas=dict(named))
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, parsed, to_avro(call))
    body = b"xx" + buf.getvalue()  # read at an offset, as from inside an event
    got, end = read(body, memoryview(body), 2)
    assert end == len(body)
    expected = from_avro(CallCaptured, fastavro.schemaless_reader(io.BytesIO(body[2:]), parsed, None))
    assert repr(to_avro(got)) == repr(to_avro(expected)) == repr(to_avro(call))
    assert list(got.prompt_token_ids) == call.prompt_token_ids and got.facts == call.facts
