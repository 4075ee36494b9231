"""Fields added to CallCaptured / CallFacts (finish_reason, max_tokens_sent, max_tokens_clamped,
logprobs_mode, prefix_route) and CallFacts.dialect symbols (GOOGLE_GENERATE_CONTENT): they round-trip, events from
every archived (older) writer still decode, with the new fields at their defaults, and a reader that predates a symbol
reads it as the enum's default."""

from __future__ import annotations

import copy
import io
import json
from importlib import resources
from typing import Any

import fastavro
import pytest

from schemas import codec
from schemas.records import CallCaptured, Dialect, IncompleteReason, PrefixRoute
from tests.factories import as_written_before_binary_hashes, event, incomplete, make_call

NEW_CALL_FIELDS = {"finish_reason": "", "prefix_route": ""}
NEW_FACT_FIELDS = {"max_tokens_sent": None, "max_tokens_clamped": False, "logprobs_mode": ""}


def _archived_event_writers() -> list[dict]:
    history = resources.files("schemas") / "avro" / "history"
    current = codec.event_codec().fingerprint.hex()
    return [json.loads(f.read_text()) for f in sorted(history.iterdir(), key=lambda f: f.name)
            if f.name.startswith("RolloutEvent.") and current not in f.name]


def _fields_of(schema: dict, name: str) -> set[str]:
    for branch in next(f for f in schema["fields"] if f["name"] == "body")["type"]:
        if isinstance(branch, dict) and branch.get("name") in (name, f"tokentrail.{name}"):
            return {f["name"] for f in branch["fields"]}
    raise AssertionError(f"{name} is not a body branch")


def test_the_new_fields_round_trip():
    call = make_call([1, 2], [3], finish_reason="repetition",
                     facts={"max_tokens": 128000, "max_tokens_sent": 32768, "max_tokens_clamped": True,
                            "logprobs_mode": "processed_logprobs"})
    back = codec.decode_event(codec.encode_event(event("r", call))).body
    assert back == call and back.finish_reason == "repetition" and back.facts.max_tokens_sent == 32768


def test_the_prefix_route_round_trips_and_the_writer_before_it_is_archived():
    for route in PrefixRoute:
        call = make_call([1, 2], [3], prefix_requested=True, prefix_supplied=bool(route), prefix_route=str(route))
        assert codec.decode_event(codec.encode_event(event("r", call))).body.prefix_route == str(route)
    older = [w for w in _archived_event_writers() if "prefix_route" not in _fields_of(w, "CallCaptured")]
    assert any("finish_reason" in _fields_of(w, "CallCaptured") for w in older), \
        "the released writer with finish_reason but without prefix_route must stay readable: keep its history file"


def test_the_new_incomplete_reasons_round_trip():
    for reason in (IncompleteReason.ENGINE_REJECTED, IncompleteReason.ABORTED, IncompleteReason.UNTRANSLATABLE_OUTPUT):
        back = codec.decode_event(codec.encode_event(event("r", incomplete("c" * 32, reason)))).body
        assert back.reason == str(reason)


def test_the_writer_before_these_fields_is_archived():
    older = [w for w in _archived_event_writers() if "finish_reason" not in _fields_of(w, "CallCaptured")]
    assert older, "the released writer without finish_reason must stay readable: keep its history file"


@pytest.mark.parametrize("writer", _archived_event_writers())
def test_an_event_from_an_older_writer_decodes_with_the_new_fields_at_their_defaults(writer):
    parsed = fastavro.parse_schema(writer)
    # Log-probs that are not float32 values stay in the float64 field every writer has.
    call = make_call([1, 2, 3], [4, 5], log_probs=[-0.1, -0.3])
    datum = as_written_before_binary_hashes(codec.to_avro(event("r-old", call)))
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, parsed, datum)  # fields the old writer lacks are simply not written
    data = codec.MAGIC + codec._fingerprint_of(parsed) + buf.getvalue()
    back = codec.decode_event(data).body
    assert isinstance(back, CallCaptured)
    assert back.generation_token_ids == [4, 5] and back.digest == call.digest
    for name, default in NEW_CALL_FIELDS.items():
        assert getattr(back, name) == default
    for name, default in NEW_FACT_FIELDS.items():
        assert getattr(back.facts, name) == default


def test_the_google_dialect_symbol_round_trips():
    call = make_call([1, 2], [3], facts={"dialect": Dialect.GOOGLE_GENERATE_CONTENT})
    assert codec.decode_event(codec.encode_event(event("r", call))).body.facts.dialect is Dialect.GOOGLE_GENERATE_CONTENT


def _without_google(schema: Any) -> Any:
    """``schema`` as a reader that predates GOOGLE_GENERATE_CONTENT wrote it (its .avsc, enum default included)."""
    if isinstance(schema, dict):
        if schema.get("type") == "enum" and schema.get("name") in ("Dialect", "tokentrail.Dialect"):
            return {**schema, "symbols": [s for s in schema["symbols"] if s != "GOOGLE_GENERATE_CONTENT"]}
        return {k: _without_google(v) for k, v in schema.items()}
    if isinstance(schema, list):
        return [_without_google(v) for v in schema]
    return schema


def test_a_reader_before_the_google_symbol_reads_it_as_unknown():
    """Adding an enum symbol is backward compatible because Dialect's Avro default is UNKNOWN: a reader whose
    schema predates the symbol resolves it to UNKNOWN instead of failing."""
    current = codec.event_codec().schema
    old_reader = _without_google(copy.deepcopy(current))
    assert old_reader != current and '"default": "UNKNOWN"' in json.dumps(old_reader)
    datum = codec.to_avro(event("r", make_call([1, 2], [3], facts={"dialect": Dialect.GOOGLE_GENERATE_CONTENT})))
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, current, datum)
    read = fastavro.schemaless_reader(io.BytesIO(buf.getvalue()), current, fastavro.parse_schema(old_reader))
    assert read["body"]["facts"]["dialect"] == "UNKNOWN"
