"""The header's hand-written Avro (hot path) is byte-for-byte the codec's; its memo and replace change nothing."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processors.state import (
    _HEADER_SCHEMA_FIELDS,
    RolloutHeader,
    decode_header,
    encode_header,
    header_codec,
    replace_header,
)
from schemas.records import RolloutFinished

ints = st.integers(min_value=-(2**31), max_value=2**31 - 1)
longs = st.integers(min_value=-(2**63), max_value=2**63 - 1)
text = st.text(max_size=40)
finished = st.none() | st.builds(RolloutFinished, attempt=ints, result_json=text,
                                 final_response_id=st.none() | text, final_text=st.none() | text)
headers = st.builds(
    RolloutHeader, rollout_id=text, version=longs, n_calls=ints, n_incomplete=ints,
    incomplete_event_ids=st.lists(text, max_size=4), late_writes=ints, frozen=st.booleans(), frozen_version=longs,
    snapshot_id=text, frozen_at=longs, finish_event_ids=st.lists(text, max_size=3), finished=finished,
    retired=st.booleans(), writes_after_retire=ints, incomplete_digests=st.lists(text, max_size=3),
    applied_partition=ints, applied_offset=longs, n_started=ints,
    schema_version=st.integers(min_value=-(2**31), max_value=1),  # a newer one is refused on decode, by design
)


def test_the_hand_encoder_writes_the_schema_fields_in_order():
    assert tuple(f["name"] for f in header_codec().schema["fields"]) == _HEADER_SCHEMA_FIELDS


@settings(max_examples=400, deadline=None)
@given(headers)
def test_encode_header_is_exactly_the_codec_and_decodes_back(header):
    raw = encode_header(header)
    assert raw == header_codec().encode(header)
    assert decode_header(raw) == header == header_codec().decode(raw)
    assert decode_header(bytes(bytearray(raw))) == header  # equal bytes from the store: the remembered header


def test_decode_header_decodes_bytes_it_never_encoded_and_refuses_what_the_codec_refuses():
    header = RolloutHeader(rollout_id="r-memo", version=3, incomplete_event_ids=["e1"])
    raw = header_codec().encode(header)
    assert decode_header(raw) == header and decode_header(memoryview(raw)) == header
    with pytest.raises(Exception) as codec_error:
        header_codec().decode(raw + b"x")
    with pytest.raises(type(codec_error.value)):
        decode_header(raw + b"x")


@given(headers, longs, ints)
def test_replace_header_is_dataclasses_replace(header, version, n_calls):
    assert replace_header(header, version=version, n_calls=n_calls) == \
        dataclasses.replace(header, version=version, n_calls=n_calls)
    with pytest.raises(TypeError, match="no_such"):
        replace_header(header, no_such=1)
