"""The SSE events a translating dialect sends are encoded by orjson at the HTTP edge
(``producers.http.replies.event_json``) and by the stdlib in the pure modules
(``producers.dialects.common.compact_json``): the two must give the same bytes for what translators
emit, so a client never sees the encoder change."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from producers.dialects.common import compact_json, encode_sse
from producers.http.replies import event_json

_scalars = st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**63 - 1) | st.text()
_events = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner,
                                                                                               max_size=4),
                       max_leaves=20)


@given(st.dictionaries(st.text(), _events, max_size=6))
def test_event_json_gives_compact_json_bytes(data):
    assert event_json(data) == compact_json(data)
    assert encode_sse("content_block_delta", data, event_json) == encode_sse("content_block_delta", data)


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_a_float_is_the_same_number(value):
    # Float spelling may differ (1e-07 / 1e-7); the number a client parses may not.
    assert json.loads(event_json({"x": value})) == json.loads(compact_json({"x": value}))


def test_what_json_cannot_hold_is_a_value_error():
    # The relay records a ValueError from a translator as untranslatable output (never a crash).
    with pytest.raises(ValueError):  # a lone surrogate is not UTF-8
        compact_json({"x": "\ud800"})
    with pytest.raises(ValueError, match="cannot be encoded as JSON"):
        event_json({"x": "\ud800"})
    # orjson holds integers to 64 bits (the stdlib any): refused, never sent wrong. None reach a translator:
    # the engine's chunks are read by orjson, which reads them as floats.
    with pytest.raises(ValueError, match="cannot be encoded as JSON"):
        event_json({"x": 2**70})
