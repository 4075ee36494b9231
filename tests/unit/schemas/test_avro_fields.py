"""``schemas.avro_fields``: what an Avro field can hold, read from the ``.avsc`` (the finish edge relies on it).

fastavro itself writes ``2**31`` into an ``int`` field (and ``True`` / ``1.5`` as 1): the codec is
no guard, so values from outside are checked against the schema first.
"""

from __future__ import annotations

import json
from importlib import resources

import pytest

from schemas.avro_fields import INT_MAX, INT_MIN, LONG_MAX, check_fields, conforms, describe, record_fields
from schemas.codec import decode_event, encode_event
from schemas.errors import ContractError
from schemas.records import RolloutEvent, RolloutFinished

NULLABLE_STRING = ["null", "string"]


@pytest.mark.parametrize("value, ok", [
    (0, True), (INT_MAX, True), (INT_MIN, True), (INT_MAX + 1, False), (INT_MIN - 1, False), (2**63, False),
    (True, False), (False, False), (1.0, False), (1.5, False), ("1", False), (None, False), ([1], False),
])
def test_an_avro_int_holds_32_bit_integers_only(value, ok):
    assert conforms("int", value) is ok


def test_long_float_boolean_bytes():
    assert conforms("long", LONG_MAX) and not conforms("long", LONG_MAX + 1) and not conforms("long", True)
    assert conforms("double", 1) and conforms("double", 0.5) and not conforms("double", True)
    assert conforms("boolean", False) and not conforms("boolean", 0)
    assert conforms("bytes", b"x") and not conforms("bytes", "x")


@pytest.mark.parametrize("value, ok", [
    (None, True), ("", True), ("done ✓", True), ("lone \udc80", False), (5, False), (b"x", False), ({}, False),
])
def test_a_nullable_string_holds_null_or_utf8_text(value, ok):
    assert conforms(NULLABLE_STRING, value) is ok


def test_complex_types():
    assert conforms({"type": "array", "items": "int"}, [1, 2]) and not conforms({"type": "array", "items": "int"},
                                                                                  [1, "2"])
    assert conforms({"type": "map", "values": "string"}, {"a": "b"}) and not conforms(
        {"type": "map", "values": "string"}, {"a": 1})
    enum = {"type": "enum", "name": "E", "symbols": ["A", "B"]}
    assert conforms(enum, "A") and not conforms(enum, "C")
    assert describe(["null", "int"]).startswith("null or an integer in [-2147483648, 2147483647]")


def test_check_fields_names_the_field_the_value_and_what_the_schema_holds():
    with pytest.raises(ContractError) as info:
        check_fields("RolloutFinished", {"attempt": 2**31})
    message = str(info.value)
    assert "'attempt'" in message and "2147483648" in message and '"int"' in message and str(INT_MAX) in message
    with pytest.raises(ContractError, match="final_text.*null or a string"):
        check_fields("RolloutFinished", {"final_text": 3})
    with pytest.raises(ContractError, match="no field 'reward'"):
        check_fields("RolloutFinished", {"reward": 1})
    check_fields("RolloutFinished", {"attempt": INT_MAX, "final_text": None, "final_response_id": "resp_tt1"})


def test_rollout_finished_fields_are_read_from_its_avsc():
    # producers.finish bounds attempt by INT_MAX because the schema says "int": keep them together.
    assert record_fields("RolloutFinished") == {"attempt": "int", "result_json": "string",
                                                "final_response_id": NULLABLE_STRING, "final_text": NULLABLE_STRING}


def test_every_field_type_of_every_schema_is_described():
    for entry in (resources.files("schemas") / "avro").iterdir():
        if entry.name.endswith(".avsc"):
            name = entry.name.removeprefix("tokentrail.").removesuffix(".avsc")
            for field, avro_type in record_fields(name).items():
                assert describe(avro_type), (name, field)
                json.dumps(avro_type)


@pytest.mark.parametrize("attempt, final_text", [(0, None), (INT_MAX, "x" * 1000), (7, "ünïcødé ✓")])
def test_what_the_check_accepts_round_trips_through_the_codec(attempt, final_text):
    values = {"attempt": attempt, "final_text": final_text, "final_response_id": None, "result_json": "{}"}
    check_fields("RolloutFinished", values)
    event = RolloutEvent(event_id="e", rollout_id="r", emitted_at=1, source="t", body=RolloutFinished(**values))
    assert decode_event(encode_event(event)) == event
