"""A large body parsed in steps: orjson's value or orjson's error, and no C call longer than a step."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from producers.http import json_in_steps
from producers.http.json_in_steps import load_json_in_steps
from producers.http.json_limits import load_json
from tests.fuzzing import fuzz_settings

STEP = 64  # small, so that every array below is parsed in several runs


def _chat(n: int, **extra) -> dict:
    return {"model": "policy", "max_tokens": 1, **extra,
            "messages": [{"role": "user", "content": f"message {i:05d} of many"} for i in range(n)]}


def _error(raw: bytes) -> str:
    with pytest.raises(ValueError) as whole:
        load_json(raw, "the request body")
    return str(whole.value)


@pytest.fixture
def parses(monkeypatch):
    """The byte length of every input orjson parses inside the module."""
    sizes: list[int] = []
    real = orjson.loads

    def counted(data):
        sizes.append(len(data))
        return real(data)

    monkeypatch.setattr(json_in_steps.orjson, "loads", counted)
    return sizes


def test_a_chat_body_is_orjsons_value_parsed_in_runs_of_about_a_step(parses):
    body = _chat(2000, tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])
    raw = json.dumps(body, indent=1).encode()
    assert load_json_in_steps(raw, "the request body", step=4096) == json.loads(raw)  # json: not counted
    # No C call reads the body whole: each run is a step plus the elements its tried cuts passed (the small
    # tools array tries MAX_TRIES cuts past its end before its elements are walked), and the brackets.
    longest_element = raw.index(b"message 00001") - raw.index(b"message 00000")  # as indented in the body
    assert len(parses) > len(raw) // 4096
    assert max(parses) <= 4096 + (json_in_steps.MAX_TRIES + 1) * (longest_element + 2) + 8, (max(parses), len(raw))


def test_elements_with_nested_objects_are_cut_only_between_elements(parses):
    # Anthropic-shaped: every message holds blocks, so most '},' candidates fall inside an element.
    body = {"model": "m", "system": "be brief", "messages": [
        {"role": "user", "content": [{"type": "text", "text": f"t{i}"},
                                     {"type": "tool_result", "tool_use_id": f"u{i}", "content": [{"type": "text",
                                                                                             "text": "},{"}]}]}
        for i in range(500)], "stream": True}
    raw = json.dumps(body).encode()
    assert load_json_in_steps(raw, "the request body", step=STEP) == body
    assert max(parses) < len(raw) // 4  # stepped, not the whole-body fallback


def test_one_long_string_is_one_element(parses):
    body = _chat(1)
    body["messages"][0]["content"] = "x" * 100_000
    raw = orjson.dumps(body)
    assert load_json_in_steps(raw, "the request body", step=STEP) == body


@pytest.mark.parametrize("raw", [
    b'{"messages": [NaN]}',  # the stdlib reads NaN, orjson refuses it
    b'{"messages": [{"a": "\\ud800"}], "x": 1}',  # a lone surrogate escape
    b'{"messages": [{"a": 1}, {"b": 2}]} trailing',
    b'{"messages": [{"a": 1}, {"b": 2}], }',
    b'{"messages": [{"a": 1},, {"b": 2}]}',
    b'{"a": 123456789012345678901234567890}',
    b'{"a": "\xff\xfe"}',  # invalid UTF-8
    b'[{"a": 1}]',  # not an object: whole, as always
    b'',
    b'   ',
    b'{"a": ' + b'[' * 1100 + b']' * 1100 + b'}',  # deeper than orjson reads
])
def test_what_orjson_refuses_gets_orjsons_error_and_what_it_reads_its_value(raw):
    try:
        expected = load_json(raw, "the request body")
    except ValueError:
        with pytest.raises(ValueError) as stepped:
            load_json_in_steps(raw, "the request body", step=4)
        assert str(stepped.value) == _error(raw)
    else:
        assert load_json_in_steps(raw, "the request body", step=4) == expected


def test_the_deepest_body_orjson_reads_is_read_not_refused():
    raw = b'{"a": ' + b'[' * 1023 + b']' * 1023 + b'}'  # 1,024 levels: the most orjson reads
    value = load_json_in_steps(raw, "the request body", step=4)["a"]
    depth = 1
    while value:  # (== on it would recurse past Python's limit)
        value, depth = value[0], depth + 1
    assert depth == 1023


def test_duplicate_keys_keep_the_last_value_in_the_first_place():
    raw = b'{"a": 1, "messages": [{"x": 1}, {"x": 2}], "a": 3}'
    stepped = load_json_in_steps(raw, "the request body", step=2)
    assert stepped == orjson.loads(raw) and list(stepped) == list(orjson.loads(raw))


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=20)


@pytest.mark.fuzz
@given(body=st.dictionaries(st.text(max_size=6), st.lists(_json, max_size=12) | _json, max_size=5),
       indent=st.sampled_from([None, 1]), step=st.integers(1, 64))
@fuzz_settings()
def test_any_object_reads_as_orjson_reads_it(body, indent, step):
    raw = json.dumps(body, indent=indent, ensure_ascii=False).encode()
    assert load_json_in_steps(raw, "the request body", step=step) == orjson.loads(raw)


@pytest.mark.fuzz
@given(raw=st.binary(max_size=64) | st.text(alphabet='{}[],:"\\ 0123456789.-eEtrufalsn', max_size=40).map(str.encode))
@fuzz_settings()
def test_any_bytes_read_as_orjson_reads_them(raw):
    try:
        expected = load_json(raw, "the request body")
    except ValueError as exc:
        with pytest.raises(ValueError) as stepped:
            load_json_in_steps(raw, "the request body", step=3)
        assert str(stepped.value) == str(exc)
    else:
        assert load_json_in_steps(raw, "the request body", step=3) == expected
