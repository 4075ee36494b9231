"""Avro single-object encoding: round trips, refusal of unknown and newer writers, schema/record agreement."""

from __future__ import annotations

import dataclasses
import io
import json
from importlib import resources

import fastavro
import pytest
from fastavro.schema import load_schema

from schemas import codec, event_bytes
from schemas.archive import TOP_LEVEL
from schemas.errors import CodecError, ContractError, SchemaVersionError
from schemas.records import (
    CallCaptured,
    CallFacts,
    CallIncomplete,
    CallSpan,
    CaptureMetrics,
    MaskReason,
    ParentResolution,
    RebuiltRollout,
    RetireRequested,
    RolloutEvent,
    RolloutFinished,
    Snapshot,
    SnapshotCall,
    TerminalAttribution,
    Trajectory,
)
from tests.factories import event, finished, incomplete, make_call, retire


def test_every_event_body_round_trips_byte_exact():
    call = make_call([1, 2, 3], [4, 5], log_probs=[-0.1234567890123, -1e-300])
    for body in (call, incomplete("abc"), finished({"reward": 0.5}, final_text="hi"), retire("s", 7)):
        ev = event("r-1", body)
        data = codec.encode_event(ev)
        assert data[:2] == b"\xc3\x01"
        back = codec.decode_event(data)
        assert back == ev
        assert codec.encode_event(back) == data


def test_log_probs_are_bit_exact_doubles():
    lps = [-0.1, -2.220446049250313e-16, -9999.0, -0.30000000000000004]
    call = make_call([1], [2, 3, 4, 5], log_probs=lps)
    back = codec.decode_event(codec.encode_event(event("r", call))).body
    assert [x.hex() for x in back.generation_log_probs] == [x.hex() for x in lps]


def test_single_object_header_is_the_crc64_fingerprint_of_the_canonical_schema():
    data = codec.encode_event(event("r", retire("s", 1)))
    assert data[2:10] == codec.event_codec().fingerprint


def test_snapshot_and_rebuilt_round_trip():
    call = make_call([1, 2], [3])
    snap = Snapshot(
        rollout_id="r",
        snapshot_id="snap",
        version=3,
        frozen_at=5,
        calls=[SnapshotCall(seq=0, call=call, lineage_note="root")],
        incomplete=True,
        incomplete_markers=[incomplete("x")],
        finished=finished(),
        conflicting_call_ids=["y"],
        late_writes=1,
    )
    assert codec.decode_snapshot(codec.encode_snapshot(snap)) == snap
    rebuilt = RebuiltRollout(
        rollout_id="r",
        snapshot_id="snap",
        version=3,
        mask_sample=False,
        mask_reasons=[MaskReason(code="c", detail="d", call_ids=["a"])],
        trajectory=Trajectory(
            token_ids=[1, 2, 3],
            loss_mask=bytes([0, 0, 1]),
            log_probs=[-0.5],
            prompt_len=2,
            spans=[CallSpan(model_call_id="a", start=0, generation_start=2, end=3, policy_version="7")],
        ),
        metrics=CaptureMetrics(
            n_calls=1, roots=1, chains=1, delivered_fraction=1.0, quarantined_calls=0, quarantined_fraction=0.0,
            empty_generation_calls=0, unresolved_parent_calls=0, parent_link_failures={"x": 1},
            generated_tokens_captured=1, generated_tokens_delivered=1, capture_incomplete=False,
            terminal_attribution=TerminalAttribution(chain="main", method="declared", call_id="a"),
        ),
        response_json="{}",
    )
    assert codec.decode_rebuilt(codec.encode_rebuilt(rebuilt)) == rebuilt


def test_garbage_is_refused_with_a_codec_error_not_a_crash():
    with pytest.raises(CodecError, match="c301"):
        codec.decode_event(b"{\"json\": true}")
    with pytest.raises(CodecError, match="corrupt"):
        codec.decode_event(codec.encode_event(event("r", make_call([1], [2])))[:-5])


def test_unknown_writer_fingerprint_says_upgrade_the_reader():
    data = bytearray(codec.encode_event(event("r", retire("s", 1))))
    data[2:10] = b"\x01" * 8
    with pytest.raises(SchemaVersionError, match="upgrade the reader"):
        codec.decode_event(bytes(data))


def test_newer_schema_version_is_refused_with_an_actionable_message():
    ev = dataclasses.replace(event("r", retire("s", 1)), schema_version=2)
    data = codec.encode_event(ev)
    with pytest.raises(SchemaVersionError, match="schema_version 2.*upgrade the reader"):
        codec.decode_event(data)


def test_record_invariants_reject_invalid_calls_naming_the_field():
    with pytest.raises(ContractError, match="generation_log_probs"):
        make_call([1], [2, 3], log_probs=[-1.0])
    with pytest.raises(ContractError, match="RESOLVED needs a parent id"):
        make_call([1], [2], resolution=ParentResolution.RESOLVED)
    with pytest.raises(ContractError, match="cum_len"):
        dataclasses.replace(make_call([1], [2]), cum_len=7)


@pytest.mark.parametrize(
    ("cls", "schema_name"),
    [
        (RolloutEvent, "RolloutEvent"), (CallCaptured, "CallCaptured"), (CallFacts, "CallFacts"),
        (CallIncomplete, "CallIncomplete"), (RolloutFinished, "RolloutFinished"),
        (RetireRequested, "RetireRequested"), (Snapshot, "Snapshot"), (RebuiltRollout, "RebuiltRollout"),
    ],
)
def test_record_fields_equal_schema_fields(cls, schema_name):
    path = resources.files("schemas") / "avro" / f"tokentrail.{schema_name}.avsc"
    schema_fields = [f["name"] for f in json.loads(path.read_text())["fields"]]
    assert sorted(codec.wire_field_names(cls)) == sorted(schema_fields)


def test_nested_schema_records_match_their_dataclasses():
    for name, cls in [("SnapshotCall", SnapshotCall), ("Trajectory", Trajectory), ("CallSpan", CallSpan),
                      ("CaptureMetrics", CaptureMetrics), ("MaskReason", MaskReason),
                      ("TerminalAttribution", TerminalAttribution)]:
        found = _find_named(load_schema(str(resources.files("schemas") / "avro" / (
            "tokentrail.Snapshot.avsc" if name == "SnapshotCall" else "tokentrail.RebuiltRollout.avsc"))), name)
        assert sorted(f["name"] for f in found["fields"]) == sorted(f.name for f in dataclasses.fields(cls)), name


def _find_named(schema, name):
    if isinstance(schema, dict):
        if schema.get("name") in (name, f"tokentrail.{name}"):
            return schema
        children = list(schema.values())
    elif isinstance(schema, list):
        children = schema
    else:
        return None
    for child in children:
        found = _find_named(child, name)
        if found:
            return found
    return None


@pytest.mark.parametrize("name", TOP_LEVEL)
def test_current_writer_schemas_are_archived(name):
    current = load_schema(str(resources.files("schemas") / "avro" / f"tokentrail.{name}.avsc"))
    archived = resources.files("schemas") / "avro" / "history" / f"{name}.{codec._fingerprint_of(current).hex()}.json"
    assert archived.is_file(), f"schema {name} changed: run `python -m schemas.archive` and commit the history file"


def test_event_body_bytes_ignore_the_envelope():
    call = make_call([1, 2, 3], [4])
    a = codec.encode_event(event("rollout-a", call, event_id="e1"))
    b = codec.encode_event(event("rollout-a", call, event_id="a-much-longer-event-id", at=99999999))
    assert event_bytes.event_body_bytes(a) == event_bytes.event_body_bytes(b)
    other = make_call([1, 2, 3], [5])
    assert event_bytes.event_body_bytes(codec.encode_event(event("rollout-a", other))) != event_bytes.event_body_bytes(a)
    assert a.endswith(event_bytes.event_body_bytes(a))


# Item 5 (issue 15): an event with bytes after its Avro body was accepted, and the fold stored its
# body with those bytes into the snapshot, which no reader could decode. Every decoder refuses them.
TRAILING = [b"\x00", b"\x00\x01\x02", b"\xc3\x01" + b"\x00" * 40]


def _sample_snapshot_and_rebuilt() -> tuple[Snapshot, RebuiltRollout]:
    snap = Snapshot(rollout_id="r", snapshot_id="snap-t", version=1, frozen_at=5,
                    calls=[SnapshotCall(seq=0, call=make_call([1, 2], [3]))], incomplete=False,
                    incomplete_markers=[], finished=finished())
    rebuilt = RebuiltRollout(
        rollout_id="r", snapshot_id="snap-t", version=1, mask_sample=True, mask_reasons=[], trajectory=None,
        metrics=CaptureMetrics(
            n_calls=0, roots=0, chains=0, delivered_fraction=0.0, quarantined_calls=0, quarantined_fraction=0.0,
            empty_generation_calls=0, unresolved_parent_calls=0, parent_link_failures={},
            generated_tokens_captured=0, generated_tokens_delivered=0, capture_incomplete=False,
            terminal_attribution=TerminalAttribution(),
        ),
    )
    return snap, rebuilt


@pytest.mark.parametrize("extra", TRAILING, ids=len)
def test_bytes_after_an_events_body_are_refused_naming_the_event_the_count_and_the_fix(extra):
    for body in (make_call([1, 2, 3], [4, 5]), incomplete("abc"), finished({"reward": 1}), retire("s", 7)):
        data = codec.encode_event(event("r-1", body, event_id="ev-trailing"))
        with pytest.raises(CodecError, match=rf"RolloutEvent event_id 'ev-trailing' has {len(extra)} byte\(s\) "
                                             r"after its Avro body.*publish each record alone"):
            codec.decode_event(data + extra)
        with pytest.raises(CodecError, match="after its Avro body"):
            event_bytes.decode_event_with_body(data + extra)
    # Two records concatenated: the second one is trailing bytes of the first.
    one = codec.encode_event(event("r-1", retire("s", 7)))
    with pytest.raises(CodecError, match=f"has {len(one)} byte"):
        codec.decode_event(one + one)


@pytest.mark.parametrize("extra", TRAILING, ids=len)
def test_bytes_after_a_snapshot_or_rebuilt_body_are_refused(extra):
    snap, rebuilt = _sample_snapshot_and_rebuilt()
    with pytest.raises(CodecError, match=rf"Snapshot snapshot_id 'snap-t' has {len(extra)} byte\(s\) after"):
        codec.decode_snapshot(codec.encode_snapshot(snap) + extra)
    with pytest.raises(CodecError, match=rf"RebuiltRollout snapshot_id 'snap-t' has {len(extra)} byte\(s\) after"):
        codec.decode_rebuilt(codec.encode_rebuilt(rebuilt) + extra)
    assert codec.decode_snapshot(codec.encode_snapshot(snap)) == snap  # exact bodies still decode


def test_bytes_after_an_event_from_an_older_writer_are_refused_too():
    history = resources.files("schemas") / "avro" / "history"
    current = codec.event_codec().fingerprint.hex()
    older = [json.loads(f.read_text()) for f in history.iterdir()
             if f.name.startswith("RolloutEvent.") and current not in f.name]
    assert older
    for writer in older:
        parsed = fastavro.parse_schema(writer)
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, codec.to_avro(event("r-old", retire("s", 1), event_id="ev-old")))
        data = codec.MAGIC + codec._fingerprint_of(parsed) + buf.getvalue()
        assert codec.decode_event(data).event_id == "ev-old"
        with pytest.raises(CodecError, match="'ev-old' has 2 byte"):
            codec.decode_event(data + b"\x00\x00")


def test_decode_event_with_body_returns_the_event_and_exactly_its_body():
    ev = event("r-1", make_call([1, 2, 3], [4]))
    data = codec.encode_event(ev)
    back, body = event_bytes.decode_event_with_body(data)
    assert back == ev and body == event_bytes.event_body_bytes(data) and data.endswith(body)
