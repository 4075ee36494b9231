"""Identifier rules (schemas.ids): model call ids, and reading a call id back from a response id."""

from __future__ import annotations

import re
import time
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.errors import ContractError
from schemas.ids import (
    CALL_ID_RULE,
    ROLLOUT_ID_RULE,
    call_id_from_response_id,
    new_model_call_id,
    response_id,
    validate_model_call_id,
)

# Every id our producers and NeMo Gym mint: the interceptor and Gym's middleware (uuid4().hex), Gym's
# conformance kit (consumers.gym.conformance: "call-1", "call-2", "call-lost"), and other common shapes.
# Named by kind: the minted ones are random, and a test id must be the same in every collecting process (xdist).
ACCEPTED = {"minted": new_model_call_id(), "uuid4-hex": uuid.uuid4().hex, "call-1": "call-1", "call-2": "call-2",
            "call-lost": "call-lost", "uuid4": str(uuid.uuid4()), "c1": "c1", "a": "a", "zeros-32": "0" * 32,
            "x-200": "x" * 200, "dotted": "chatcmpl-abc.1_2"}
# What keys (NUL-separated), logs and the snapshot cannot hold, and what no producer mints.
REFUSED = ["", "a/b", "/", "a\x00b", "a\nb", "abc\n", "a b", " call-1", "-lead", ".lead", "_lead", "x" * 201,
           "ü", "call\t1", "call:1", "a\x7fb"]


@pytest.mark.parametrize("call_id", list(ACCEPTED.values()), ids=list(ACCEPTED))
def test_the_ids_our_producers_and_gym_mint_are_accepted(call_id):
    assert validate_model_call_id(call_id) == call_id


@pytest.mark.parametrize("call_id", REFUSED, ids=lambda c: repr(c) if len(c) < 20 else f"{len(c)}-chars")
def test_a_malformed_call_id_is_refused_naming_the_field_the_value_and_the_rule(call_id):
    with pytest.raises(ContractError) as info:
        validate_model_call_id(call_id, field="CallStarted.model_call_id")
    message = str(info.value)
    assert "CallStarted.model_call_id" in message and CALL_ID_RULE in message and "new_model_call_id" in message
    assert repr(call_id)[:40] in message


@pytest.mark.parametrize("value", [None, 7, b"abc"])
def test_a_call_id_that_is_not_a_string_is_refused(value):
    with pytest.raises(ContractError, match="model_call_id"):
        validate_model_call_id(value)


def test_a_huge_id_is_named_by_a_prefix_and_its_length_not_copied_into_the_message():
    with pytest.raises(ContractError) as info:
        validate_model_call_id("y" * 1_000_000)
    assert "(1000000 characters)" in str(info.value) and len(str(info.value)) < 1000


def test_call_ids_and_rollout_ids_share_one_alphabet():
    assert CALL_ID_RULE == ROLLOUT_ID_RULE  # one rule to explain; change both together, deliberately


# The pattern before the fix, to prove the linear one reads the same ids.
_OLD_PATTERN = re.compile(r"[A-Za-z][A-Za-z0-9_-]*?[-_]tt([0-9a-f]{32})")
_PIECES = st.sampled_from(["a", "t", "_", "-", "0", "f", "9", ".", " ", "x", "chatcmpl-", "msg_", "_tt", "-tt",
                           "tt", "0123456789abcdef"])


@settings(max_examples=500, deadline=None)
@given(st.lists(_PIECES, max_size=14))
def test_the_response_id_pattern_reads_exactly_what_it_read_before(pieces):
    s = "".join(pieces)
    old = _OLD_PATTERN.search(s)
    assert call_id_from_response_id(s) == (old.group(1) if old else None)


def test_reading_a_call_id_from_a_long_final_response_id_is_linear():
    # A harness-supplied final_response_id is unbounded; the old pattern took ~2 s at 16k characters
    # and hours at 1 MB, stalling the rebuild of every rollout behind it.
    call_id = new_model_call_id()
    for s in ("a" * 200_000, "a-" * 100_000, "x" * 200_000 + response_id("resp_", call_id)):
        start = time.perf_counter()
        found = call_id_from_response_id(s)
        assert time.perf_counter() - start < 0.5, len(s)
    assert found == call_id
