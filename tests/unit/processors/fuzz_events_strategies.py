"""Inputs for the event-topic fuzz tier (issue 15 item 2): good logs, corruptions, absurd envelopes.

- ``GOOD``: three good rollouts (a verified delta chain delivered unmasked, and two random scenario
  rollouts with forks, oddities, late writes, retirements), folded alone once: ``BASELINE``;
- ``VICTIM``: a small good rollout whose own records get corrupted (delivered unmasked when clean);
- ``RETIRED``: a rollout frozen and retired before any garbage arrives;
- ``corruptions()``: a (key, value, kind) derived from a victim record: truncated, bit-flipped,
  spliced, with bytes appended, empty, None, random bytes (behind a valid header or not), and
  keyed by the victim, by no key, or by a wrong key that is not a good rollout;
- ``absurd_events()``: well-formed Avro events (the codec's own schema, written with fastavro so the
  record classes' invariants do not stop them) whose fields are extreme.
"""

from __future__ import annotations

import io
import math
import random
import struct
from dataclasses import dataclass

import fastavro
from hypothesis import strategies as st

from processors.replay import replay
from schemas.codec import MAGIC, encode_event, event_codec, to_avro
from schemas.records import RolloutEvent
from tests.factories import event, finished, hashed, incomplete, retire, started
from tests.unit.processors.scenarios import RolloutPlan, realistic_rollout, rollout_events

GOOD = ("good-chain-a", "good-scenario-b", "good-scenario-c")
VICTIM = "victim-rollout-0001"
RETIRED = "retired-rollout-0001"
STRANGER = "stranger-rollout-0001"  # a valid rollout id that holds no good rollout: a wrong key


def _chain_events(rid: str, n_calls: int, context: int) -> list[RolloutEvent]:
    calls = realistic_rollout(n_calls, context)
    evs = [event(rid, started(calls[0].model_call_id), event_id=f"{rid}/ev/start")]
    evs += [event(rid, c, event_id=f"{rid}/ev/{i}") for i, c in enumerate(calls)]
    evs.append(event(rid, finished({"reward": 1.0}), event_id=f"{rid}/ev/finish"))
    return evs


def _records(evs: list[RolloutEvent]) -> list[tuple[bytes, bytes]]:
    return [(e.rollout_id.encode(), encode_event(e)) for e in evs]


GOOD_RECORDS: dict[str, list[tuple[bytes, bytes]]] = {
    GOOD[0]: _records(_chain_events(GOOD[0], 5, 60)),
    GOOD[1]: _records(rollout_events(random.Random(11), GOOD[1], RolloutPlan(n_calls=5))),
    GOOD[2]: _records(rollout_events(random.Random(12), GOOD[2], RolloutPlan(n_calls=4, p_retire=1.0))),
}
VICTIM_EVENTS = _chain_events(VICTIM, 3, 24)
VICTIM_RECORDS = _records(VICTIM_EVENTS)
VICTIM_CALL_IDS = [e.body.model_call_id for e in VICTIM_EVENTS if type(e.body).__name__ == "CallCaptured"]


def _retired_records() -> list[tuple[bytes, bytes]]:
    evs = _chain_events(RETIRED, 2, 12)
    snap = [s for step in replay(_records(evs)) for s in step.result.emitted][-1]
    evs.append(event(RETIRED, retire(snap.snapshot_id, snap.version), event_id=f"{RETIRED}/ev/retire"))
    return _records(evs)


RETIRED_RECORDS = _retired_records()


@dataclass(frozen=True)
class Outcome:
    """What one rollout's records gave, record by record: emitted snapshot bytes and dead letters."""

    emitted: tuple[tuple[bytes, ...], ...]
    deadletters: tuple[tuple, ...]


def fold_alone(records) -> Outcome:
    steps = list(replay(records))
    return Outcome(tuple(tuple(e.data for e in s.result.emitted) for s in steps),
                   tuple(tuple(s.result.deadletters) for s in steps))


BASELINE: dict[str, Outcome] = {rid: fold_alone(recs) for rid, recs in GOOD_RECORDS.items()}

# ------------------------------------------------------------------ corruptions of victim records

WRONG_KEYS = [None, STRANGER.encode(), b"", b"\xff\xfe", b"has space", b"a/b", b"x" * 300]


@st.composite
def corrupted_value(draw, value: bytes) -> tuple[str, bytes | None]:
    """A corruption of one encoded event: (kind, the corrupted bytes or None)."""
    kind = draw(st.sampled_from(["truncate", "bitflip", "splice", "append", "append-event", "empty", "none",
                                 "random", "random-behind-header"]))
    if kind == "truncate":
        return kind, value[:draw(st.integers(0, len(value) - 1))]
    if kind == "bitflip":
        out = bytearray(value)
        for _ in range(draw(st.integers(1, 8))):
            bit = draw(st.integers(0, len(out) * 8 - 1))
            out[bit // 8] ^= 1 << (bit % 8)
        return kind, bytes(out)
    if kind == "splice":
        start = draw(st.integers(0, len(value)))
        end = draw(st.integers(start, min(len(value), start + 16)))
        return kind, value[:start] + draw(st.binary(min_size=1, max_size=32)) + value[end:]
    if kind == "append":
        return kind, value + draw(st.binary(min_size=1, max_size=32))
    if kind == "append-event":
        return kind, value + draw(st.sampled_from(VICTIM_RECORDS))[1]
    if kind == "empty":
        return kind, b""
    if kind == "none":
        return kind, None
    if kind == "random":
        return kind, draw(st.binary(max_size=200))
    return kind, value[:10] + draw(st.binary(max_size=200))  # a valid magic and fingerprint, random body


@st.composite
def corruptions(draw) -> tuple[int, bytes | None, bytes | None, str, str]:
    """(victim record index, key, value, corruption kind, key kind)."""
    index = draw(st.integers(0, len(VICTIM_RECORDS) - 1))
    key, value = VICTIM_RECORDS[index]
    kind, bad = draw(corrupted_value(value))
    key_kind = draw(st.sampled_from(["victim"] * 6 + ["none", "wrong"]))
    if key_kind == "none":
        key = None
    elif key_kind == "wrong":
        key = draw(st.sampled_from(WRONG_KEYS[1:]))
    return index, key, bad, kind, key_kind


# ------------------------------------------------------------------ absurd but well-formed envelopes

_LONG = st.one_of(st.sampled_from([0, -1, 1, 2**31 - 1, -2**31, 2**63 - 1, -2**63]),
                  st.integers(-2**63, 2**63 - 1))
_INT = st.one_of(st.sampled_from([0, -1, 1, 2**31 - 1, -2**31]), st.integers(-2**31, 2**31 - 1))
_FLOAT = st.one_of(st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0, 1e308]), st.floats())
_TEXT = st.one_of(st.sampled_from(["", " ", "\x00", "ü" * 3, "a/b", "x" * 5000, "NaN", "{}", "[]", "null"]),
                  st.text(max_size=40))
_SELF = "<the call's own id>"  # parent_call_id: replaced by the call's model_call_id (a self-parent)
_ID = st.one_of(
    st.sampled_from(["", "a", "a/b", "a\x00b", "line\nbreak", " lead", "ü", "x" * 200, "x" * 201, "x" * 20_000,
                     "-dash",
                     "0" * 32, "call-1"]),
    st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,30}\Z"),
    st.text(max_size=30),
)
_JSON = st.one_of(_TEXT, st.sampled_from(['{"reward": NaN}', '{"reward": Infinity}', '{"reward": 1e999}',
                                          '[' * 500 + ']' * 500, '{"reward": 1.0}', '"str"', '{"a": 1}{',
                                          '{"reward": ' + "9" * 5000 + '}']))


def _u32s(values: list[int]) -> bytes:
    return struct.pack(f"<{len(values)}I", *values)


def _f64s(values: list[float]) -> bytes:
    return struct.pack(f"<{len(values)}d", *values)


# A hash field (schemas.wire_kinds.HashBytes) as the wire carries it: raw bytes, of any length, or the
# victim rollout's own fingerprints (processors/scenarios.py names them fp<i> and cfp-<call id>).
_HASH = st.one_of(st.sampled_from([b"", b"\x00" * 32, *(bytes.fromhex(hashed(f"fp{i}")) for i in range(3))]),
                  st.binary(max_size=40))
_U32_BYTES = st.one_of(st.lists(st.integers(0, 2**32 - 1), max_size=12).map(_u32s),
                       st.binary(max_size=30))  # any length: not always a multiple of 4
_F64_BYTES = st.one_of(st.lists(_FLOAT, max_size=12).map(_f64s), st.binary(max_size=40))

# Field -> value strategy, per body type ("" = the envelope).
ABSURD_FIELDS: dict[str, dict[str, st.SearchStrategy]] = {
    "": {"event_id": st.one_of(_ID, st.sampled_from([e.event_id for e in VICTIM_EVENTS] + ["good-chain-a/ev/0"])),
         "rollout_id": st.one_of(_ID, st.sampled_from([VICTIM, RETIRED, STRANGER, GOOD[0]])),
         "emitted_at": _LONG, "source": _TEXT, "schema_version": st.sampled_from([-2**31, -1, 0, 1, 2, 2**31 - 1])},
    "tokentrail.CallCaptured": {
        "model_call_id": st.one_of(_ID, st.sampled_from(VICTIM_CALL_IDS)),
        "created_at": _FLOAT, "prompt_token_ids": _U32_BYTES, "generation_token_ids": _U32_BYTES,
        "generation_log_probs": _F64_BYTES, "cum_len": _LONG, "digest": _HASH,
        "parent_call_id": st.one_of(st.none(), _ID, st.sampled_from(VICTIM_CALL_IDS + [_SELF])),
        "parent_resolution": st.sampled_from(["ROOT", "RESOLVED", "UNRESOLVED"]),
        "prompt_is_delta": st.booleans(), "token_item_index": st.one_of(st.none(), _INT),
        "output_items_json": _JSON, "routed_experts_json": st.one_of(st.none(), _JSON),
        "request_fingerprint": _HASH, "continuation_fingerprint": _HASH,
        "continuation_context_len": _INT, "fingerprint_version": _INT, "parent_digest": _HASH,
        "finish_reason": _TEXT,
    },
    "tokentrail.RolloutFinished": {"attempt": _INT, "result_json": _JSON,
                                   "final_response_id": st.one_of(st.none(), _TEXT, st.sampled_from(
                                       [f"msg_tt{c}" for c in VICTIM_CALL_IDS] + ["msg_tt" + "f" * 32])),
                                   "final_text": st.one_of(st.none(), _TEXT)},
    "tokentrail.CallIncomplete": {"model_call_id": st.one_of(st.none(), _ID), "reason": _TEXT,
                                  "http_status": st.one_of(st.none(), _INT), "detail": _TEXT, "created_at": _FLOAT},
    "tokentrail.RetireRequested": {"snapshot_id": _TEXT, "version": _LONG, "consumer": _TEXT},
    "tokentrail.CallStarted": {"model_call_id": _ID, "route": _TEXT, "created_at": _FLOAT},
}


def write_datum(datum: dict) -> bytes:
    """The single-object encoding of an event datum, written without the record classes' checks."""
    c = event_codec()
    buf = io.BytesIO()
    buf.write(MAGIC + c.fingerprint)
    fastavro.schemaless_writer(buf, c.schema, datum)
    return buf.getvalue()


_TEMPLATES = VICTIM_EVENTS + [
    event(VICTIM, retire("0" * 32, 3), event_id=f"{VICTIM}/ev/retire"),
    event(VICTIM, incomplete(VICTIM_CALL_IDS[0]), event_id=f"{VICTIM}/ev/incomplete"),
]


@st.composite
def absurd_events(draw) -> tuple[bytes | None, bytes, list[str]]:
    """(key, value, the mutated fields as 'body.field'): a victim-like event with 1-4 extreme fields."""
    template = draw(st.sampled_from(_TEMPLATES))
    datum = to_avro(template)
    body_name, body = datum["body"]
    body = dict(body)
    fields = [("", f) for f in ABSURD_FIELDS[""]] + [(body_name, f) for f in ABSURD_FIELDS[body_name]]
    chosen = draw(st.lists(st.sampled_from(fields), min_size=1, max_size=4, unique=True))
    for where, name in chosen:
        value = draw(ABSURD_FIELDS[where][name])
        (datum if where == "" else body)[name] = value
    if body.get("parent_call_id") == _SELF:
        body["parent_call_id"] = body["model_call_id"]
    datum["body"] = (body_name, body)
    key = draw(st.sampled_from(["own", "own", "own", "victim", "none", "retired"]))
    if key == "retired":  # a late writer of a retired rollout (its records are folded first)
        datum["rollout_id"], key = RETIRED, "own"
    rid = datum["rollout_id"]
    if key == "own":
        key_bytes = rid.encode("utf-8", "surrogatepass")
    elif key == "victim":
        key_bytes = VICTIM.encode()
    else:
        key_bytes = None
    target = key_bytes.decode("utf-8", "replace") if key_bytes is not None else rid
    if target in GOOD:  # a valid event of a good rollout would change it legitimately: mis-key it instead
        key_bytes = VICTIM.encode()
    return key_bytes, write_datum(datum), [f"{where.removeprefix('tokentrail.') or 'envelope'}.{n}"
                                           for where, n in chosen]
