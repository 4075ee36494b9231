"""The fold: everything about a rollout is decided from its ordered events.

``fold(state: StateReader, event) -> FoldResult`` is pure and deterministic: it
reads the rollout's state through a ``StateReader`` and returns the writes to
apply, in order (the rollout's header is the commit point), the snapshots to
emit and the dead letters to publish. Live (Faust over RocksDB) and replay
(``processors.replay``: an in-memory state and the one offline fold loop) run
the same code, so the same events give the same snapshots, byte for byte.

Guarantees:
- Idempotent: a repeated event (same event id; or same model_call_id with the
  same payload bytes; or an incomplete marker with the same payload) changes
  nothing. A different payload for a known call marks the rollout incomplete
  with reason ``conflicting_payload``.
- Redelivery-safe: given the event's (partition, offset), an event at or below
  the last position that changed the rollout is an at-least-once redelivery
  and changes nothing, whatever happened since (a retire, later writes). It
  only re-emits what it may still owe: the snapshot, if it is the finish that
  froze the current state, or its write-after-retire dead letter.
- Crash-safe: the writes of an event cut short at any point leave a state in
  which its redelivery (and that of every event before it) gives the clean
  result. Bodies are written before the header, the commit point, so a
  half-applied event is redone; a retirement, the one event that deletes,
  writes its tombstone first and redoes its deletes when redelivered.
- Lineage: every parent claim is verified and calls that arrived unresolved are
  resolved from the events alone (``processors.lineage``). Nothing is guessed.
- Custody: a CallStarted intent (Gym's ``begin_call``) whose call has no
  CallCaptured when the rollout is frozen makes the snapshot incomplete
  (``intent_without_capture``); a later capture of that call clears it.
- Lifecycle: RolloutFinished freezes (snapshot ids are derived from rollout id
  and version); every state change bumps the version; writes after a freeze
  are kept as evidence; RetireRequested removes state only for the exact
  snapshot id and version and leaves a tombstone, so later writers of the
  retired attempt are reported as dead letters (``write_after_retire``).
- One record per rollout attempt: the first finish decides the rollout's
  result. The same payload again emits nothing (no second record); another
  payload (result, final answer or attempt) is dead-lettered
  ``conflicting_finish`` naming both finishes; only its event id is kept (a
  re-published copy is a duplicate), the version is not bumped, so the record
  already emitted stands and its retirement still applies. The
  one re-freeze: evidence written after the freeze, then the same finish again
  (its snapshot carries the late writes, which the rebuild masks by default).
- Bad input never stops the stream: an undecodable, newer-schema or invalid
  event (bytes after its Avro body, a rollout or model call id outside its
  rule in ``schemas.ids``, a key that is not its rollout id), or one the fold
  cannot apply, becomes a dead letter with the reason. Fail closed: a refused
  record keyed to a valid rollout id marks that rollout incomplete
  (``invalid_event``, naming the reason), since what it carried is lost;
  other rollouts are untouched.
- Snapshots decode: a call is stored as the exact body bytes of an event that
  decoded strictly (nothing after its body) or as a re-encoding, and the
  snapshot splices those bytes, so every emitted snapshot is a valid record.
"""

from __future__ import annotations

import hashlib

from processors import lineage
from processors.decode import decode_for_fold
from processors.snapshot import CONFLICTING_PAYLOAD
from processors.state import (
    RolloutHeader,
    StoredIncomplete,
    call_key,
    fingerprint_key,
    incomplete_codec,
    incomplete_key,
    index_codec,
    intent_call_key,
    intent_key,
    replace_header,
    seq_key,
)
from processors.stored_call import encode_call_body, encode_index_entries, encode_stored_call
from processors.txn import DeadLetter, FoldResult, Position, StateReader, StateReadError, Txn
from schemas.codec import encode_event
from schemas.errors import CodecError, ContractError
from schemas.event_bytes import event_body_bytes
from schemas.ids import validate_model_call_id, validate_rollout_id
from schemas.records import (
    CallCaptured,
    CallIncomplete,
    CallStarted,
    IncompleteReason,
    RetireRequested,
    RolloutEvent,
    RolloutFinished,
)

# The refusal a marker quotes is cut here (a dead letter's detail can be long: a fastavro message, a value).
_DETAIL_LIMIT = 600

__all__ = ["CONFLICTING_PAYLOAD", "DeadLetter", "FoldResult", "StateReadError", "StateReader", "fold", "fold_raw",
           "snapshot_id_for"]


def fold_raw(state: StateReader, key: bytes | None, value: bytes, *, position: Position | None = None) -> FoldResult:
    """Decode one Kafka record and fold it; undecodable or invalid records become dead letters.

    A refused record is lost evidence of the rollout it is keyed to (it may have been one of
    its calls), so, fail closed, that rollout gets an ``invalid_event`` incomplete marker
    naming the reason (``_refused``); a record that names no valid rollout only dead-letters.
    """
    event = None
    try:
        event, body = decode_for_fold(value)
        _validate(event, key)
    except (CodecError, ContractError) as exc:
        return _refused(state, key, event, value, DeadLetter(type(exc).__name__, str(exc), _safe_key(key)), position)
    try:
        return fold(state, event, body=body, position=position)
    except StateReadError:
        raise
    except Exception as exc:
        # The fold is deterministic, so an event it cannot apply (a bug, a corrupt state) would fail
        # the same way on every retry: park it with the reason rather than stop the partition.
        return FoldResult(deadletters=[DeadLetter("FoldError", f"{type(exc).__name__}: {exc}", event.rollout_id)])


def _validate(event: RolloutEvent, key: bytes | None) -> None:
    """The checks a decoded event must pass before it is folded (each error names field, value and fix)."""
    validate_rollout_id(event.rollout_id)
    if key is not None and key != event.rollout_id.encode():
        raise ContractError(
            f"record key {key!r} differs from rollout_id {event.rollout_id!r}: producers must key "
            "every event by its UTF-8 rollout id"
        )
    msg = event.body
    # Call ids become state keys and snapshot fields: one rule (schemas.ids), checked before any write.
    # A CallIncomplete may have none (the call failed before one was minted).
    call_id = getattr(msg, "model_call_id", None)
    if isinstance(msg, (CallCaptured, CallStarted)) or (isinstance(msg, CallIncomplete) and call_id is not None):
        validate_model_call_id(call_id, field=f"{type(msg).__name__}.model_call_id")


def _refused(state: StateReader, key: bytes | None, event: RolloutEvent | None, value: bytes, dead: DeadLetter,
             position: Position | None) -> FoldResult:
    """The dead letter of a refused record, and an ``invalid_event`` marker on the rollout it belongs to.

    The rollout is the record's key (where it was partitioned and folded), or the decoded event's
    rollout id when the record has no key; neither valid: only the dead letter. The marker is an
    ordinary fold of a CallIncomplete whose event id is derived from the record's bytes, so a
    redelivered or re-published copy adds nothing and live and replay give the same state.
    Exactly one dead letter per refused record: the marker's own fold (say, after a retirement) adds none.
    """
    rollout_id = _rollout_of(key, event)
    if rollout_id is None:
        return FoldResult(deadletters=[dead])
    raw = bytes(value) if isinstance(value, (bytes, bytearray, memoryview)) else repr(value).encode()
    marker = RolloutEvent(
        event_id="invalid-" + hashlib.sha256(raw).hexdigest()[:32],
        rollout_id=rollout_id,
        emitted_at=0,
        source="processor",
        body=CallIncomplete(
            reason=IncompleteReason.INVALID_EVENT,
            detail=(f"an event keyed to this rollout was dead-lettered ({dead.reason}: {dead.detail}"[:_DETAIL_LIMIT]
                    + "); its evidence is lost: fix the producer, then re-run the rollout"),
        ),
    )
    try:
        result = fold(state, marker, position=position)
    except StateReadError:
        raise
    except Exception:  # a corrupt state: the dead letter still says why the record was refused
        return FoldResult(deadletters=[dead])
    result.deadletters[:] = [dead]
    return result


def _rollout_of(key: bytes | None, event: RolloutEvent | None) -> str | None:
    """The valid rollout id a refused record belongs to (its key, else its event's), or None."""
    try:
        if key is not None:
            return validate_rollout_id(key.decode("utf-8"))
        return validate_rollout_id(event.rollout_id) if event is not None else None
    except (ContractError, UnicodeDecodeError, AttributeError):
        return None


def fold(
    state: StateReader, event: RolloutEvent, *, body: bytes | None = None, position: Position | None = None
) -> FoldResult:
    """Fold one decoded event into the state; see the module docstring for the guarantees.

    ``body`` is the event's Avro body bytes, exactly (``decode_event_with_body``; computed when
    omitted): a call's body is stored and spliced into snapshots as is. ``position`` is the
    event's (partition, offset), when it came from Kafka.
    """
    txn = Txn(state, event.rollout_id, position)
    payload = hashlib.sha256(body if body is not None else event_body_bytes(encode_event(event))).hexdigest()
    if txn.redelivered:
        _fold_redelivered(txn, event)
        return txn.result  # the state already has this event (a cut-short retirement aside)
    msg = event.body
    if txn.header.retired and not isinstance(msg, RetireRequested):
        txn.header = replace_header(txn.header, writes_after_retire=txn.header.writes_after_retire + 1)
        txn.result.deadletters.append(_after_retire(txn.header, event))
    elif isinstance(msg, CallCaptured):
        _fold_capture(txn, event, msg, payload, body)
    elif isinstance(msg, CallIncomplete):
        _fold_incomplete(txn, event.event_id, msg, payload[:32])
    elif isinstance(msg, RolloutFinished):
        _fold_finished(txn, event, msg)
    elif isinstance(msg, RetireRequested):
        _fold_retire(txn, msg)
    elif isinstance(msg, CallStarted):
        _fold_started(txn, msg)
    return txn.commit()


def _fold_redelivered(txn: Txn, event: RolloutEvent) -> None:
    header, msg = txn.header, event.body
    txn.result.notes.append(f"redelivered event {event.event_id} at {txn.position}: already folded")
    if txn.position is None or txn.position[1] != header.applied_offset:
        return  # a later event changed the state, so this one's outputs were acknowledged before it
    if isinstance(msg, RolloutFinished) and header.frozen and not header.retired and header.finished != msg:
        txn.result.deadletters.append(_conflicting_finish(header, event, msg))  # a refused finish owes its refusal
    elif isinstance(msg, RolloutFinished) and header.frozen and not header.retired and not header.changed_since_freeze:
        txn.emit(header)
    elif isinstance(msg, RetireRequested) and header.retired:
        _sweep(txn, header)  # this retirement may have been cut short after its tombstone
    elif header.retired and header.writes_after_retire:
        txn.result.deadletters.append(_after_retire(header, event))


def _after_retire(header: RolloutHeader, event: RolloutEvent) -> DeadLetter:
    msg = event.body
    what = (f"{type(msg).__name__} event {event.event_id} arrived after rollout {event.rollout_id!r} was retired "
            f"(snapshot {header.snapshot_id} v{header.version}, delivered and handed off)")
    if isinstance(msg, RolloutFinished):
        detail = (f"{what}: its result (field 'result' = {_shown(msg.result_json)}) was not delivered. A rollout id "
                  "names one attempt and that attempt's record is out: a re-sent finish of it loses nothing; a new "
                  "result or a new attempt needs a new rollout id")
    else:
        detail = f"{what}; a late writer of a retired attempt, not delivered: use a new rollout id per attempt"
    return DeadLetter("write_after_retire", detail, event.rollout_id)


def _fold_capture(txn: Txn, event: RolloutEvent, call: CallCaptured, payload: str, body: bytes | None) -> None:
    header = txn.header
    existing = txn.call_head(call.model_call_id)
    if existing is not None and existing.seq < header.n_calls:
        if existing.payload_digest == payload:
            txn.result.notes.append(f"duplicate call {call.model_call_id}")
            return
        marker = CallIncomplete(
            model_call_id=call.model_call_id,
            reason=CONFLICTING_PAYLOAD,
            route=call.facts.route,
            detail=f"payload {payload[:16]} differs from the stored {existing.payload_digest[:16]}",
            created_at=call.created_at,
        )
        # Keyed by the conflicting payload, so a re-published copy of it adds no second marker.
        _fold_incomplete(txn, event.event_id, marker, f"conflict:{call.model_call_id}:{payload[:32]}")
        return
    # New call, or a body left by an event whose header write never happened: (re)apply.
    stored, note = lineage.decide(txn, call)
    if stored is not call or body is None:
        body = encode_call_body(stored)
    seq = header.n_calls
    txn.put(call_key(txn.rollout_id, call.model_call_id), encode_stored_call(
        seq=seq, payload_digest=payload, late=header.frozen, lineage_note=note, call=stored, body=body,
    ))
    txn.put(seq_key(txn.rollout_id, seq), call.model_call_id.encode())
    if call.continuation_fingerprint:
        _index_call(txn, call)
    txn.header = replace_header(
        header,
        n_calls=seq + 1,
        version=header.version + 1,
        late_writes=header.late_writes + (1 if header.frozen else 0),
    )


def _index_call(txn: Txn, call: CallCaptured) -> None:
    key = fingerprint_key(txn.rollout_id, call.continuation_fingerprint)
    raw = txn.get(key)
    entries = [(e.call_id, e.cum_len, e.digest) for e in index_codec().decode(raw).entries] if raw is not None else []
    if any(call_id == call.model_call_id for call_id, _, _ in entries):
        return
    entries.append((call.model_call_id, call.cum_len, call.digest))
    txn.put(key, encode_index_entries(entries))


def _fold_incomplete(txn: Txn, event_id: str, marker: CallIncomplete, digest: str) -> None:
    header = txn.header
    if event_id in header.incomplete_event_ids or digest in header.incomplete_digests:
        txn.result.notes.append(f"duplicate incomplete marker (event {event_id})")
        return
    seq = header.n_incomplete
    txn.put(
        incomplete_key(txn.rollout_id, seq),
        incomplete_codec().encode(StoredIncomplete(event_id=event_id, marker=marker, late=header.frozen)),
    )
    txn.header = replace_header(
        header,
        n_incomplete=seq + 1,
        incomplete_event_ids=[*header.incomplete_event_ids, event_id],
        incomplete_digests=[*header.incomplete_digests, digest],
        version=header.version + 1,
        late_writes=header.late_writes + (1 if header.frozen else 0),
    )


def _fold_started(txn: Txn, intent: CallStarted) -> None:
    """Record a pre-dispatch intent; the snapshot reports it while no capture of that call exists."""
    header, rid, call_id = txn.header, txn.rollout_id, intent.model_call_id
    seen = txn.get(intent_call_key(rid, call_id))
    if seen is not None and int.from_bytes(seen, "big") < header.n_started:
        txn.result.notes.append(f"duplicate intent for call {call_id}")
        return
    captured = txn.call_head(call_id)
    if captured is not None and captured.seq < header.n_calls:
        txn.result.notes.append(f"intent for call {call_id}, already captured")
        return
    seq = header.n_started
    txn.put(intent_key(rid, seq), call_id.encode())
    txn.put(intent_call_key(rid, call_id), seq.to_bytes(4, "big"))
    txn.header = replace_header(
        header,
        n_started=seq + 1,
        version=header.version + 1,
        late_writes=header.late_writes + (1 if header.frozen else 0),
    )


def _fold_finished(txn: Txn, event: RolloutEvent, finished: RolloutFinished) -> None:
    """Freeze the rollout; after the first freeze, no finish mints a second record for the attempt.

    The first freeze's snapshot may be delivered at once, so nothing a later finish does can take it
    back: the same payload again (a re-sent finish) changes nothing and emits nothing, and another payload
    is a conflict, dead-lettered ``conflicting_finish`` with the state untouched (that record stands and
    its retirement still applies). One exception keeps late evidence visible: evidence written after the
    freeze followed by the same finish again re-freezes, and that snapshot carries its late writes.
    """
    header = txn.header
    if event.event_id in header.finish_event_ids:
        # A re-published copy of a finish already folded (a producer retry, a drained spool).
        txn.result.notes.append(f"duplicate finish event {event.event_id}")
        return
    if header.frozen and header.finished is not None and header.finished != finished:
        # Refused; its event id is kept (the version is not bumped, so the snapshot out there stays current
        # and its retirement applies) so that a re-published copy is a duplicate, not a second refusal.
        txn.result.deadletters.append(_conflicting_finish(header, event, finished))
        txn.header = replace_header(header, finish_event_ids=[*header.finish_event_ids, event.event_id])
        return
    if header.frozen and not header.changed_since_freeze:
        txn.result.notes.append(f"duplicate finish {event.event_id}: snapshot {header.snapshot_id} "
                                f"v{header.version} was emitted by its first finish")
        return
    # The first freeze, or the same finish again after evidence written since the freeze: a new state.
    version = header.version + 1
    txn.header = replace_header(
        header,
        version=version,
        frozen=True,
        frozen_version=version,
        snapshot_id=snapshot_id_for(txn.rollout_id, version),
        frozen_at=event.emitted_at,
        finished=finished,
        finish_event_ids=[*header.finish_event_ids, event.event_id],
    )
    txn.emit(txn.header)


# RolloutFinished's fields, as the finish API and route name them (``producers.finish.FINISH_FIELDS``).
_FINISH_FIELDS = (("result", "result_json"), ("final_response_id", "final_response_id"),
                  ("final_text", "final_text"), ("attempt", "attempt"))


def _conflicting_finish(header: RolloutHeader, event: RolloutEvent, finished: RolloutFinished) -> DeadLetter:
    first = header.finished
    assert first is not None
    differ = "; ".join(
        f"field '{name}' = {_shown(getattr(finished, attr))} where the first finish has {_shown(getattr(first, attr))}"
        for name, attr in _FINISH_FIELDS if getattr(finished, attr) != getattr(first, attr))
    return DeadLetter(
        "conflicting_finish",
        f"RolloutFinished event {event.event_id} of rollout {event.rollout_id!r} conflicts with its first finish, "
        f"event {header.finish_event_ids[0] if header.finish_event_ids else '?'}: {differ}. One record per rollout "
        f"attempt: the first finish froze snapshot {header.snapshot_id} v{header.frozen_version}, which stands (the "
        "consumer may already have delivered it); this finish was not applied. A new result is a new attempt: run "
        "it under a new rollout id",
        event.rollout_id,
    )


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _fold_retire(txn: Txn, retire: RetireRequested) -> None:
    header = txn.header
    if header.retired:
        txn.result.notes.append("already retired")
        return
    if not (header.frozen and retire.snapshot_id == header.snapshot_id and retire.version == header.version):
        txn.result.notes.append(
            f"stale retire of {retire.snapshot_id} v{retire.version} kept the evidence "
            f"(current: {header.snapshot_id or 'not frozen'} v{header.version})"
        )
        return
    # The tombstone first (the one event that deletes): once it is in the state, every earlier event
    # is a redelivery by position, so none is re-decided on half-deleted bodies; the deletes below are
    # redone by this event's own redelivery (``_fold_redelivered``) if they were cut short. It keeps
    # the identity, so late writers of this attempt are detected, and the counts, for that sweep.
    txn.header = RolloutHeader(
        rollout_id=txn.rollout_id,
        version=header.version,
        n_calls=header.n_calls,
        n_incomplete=header.n_incomplete,
        frozen=True,
        frozen_version=header.frozen_version,
        snapshot_id=header.snapshot_id,
        frozen_at=header.frozen_at,
        retired=True,
        n_started=header.n_started,
    )
    txn.header_first = True
    _sweep(txn, header)


def _sweep(txn: Txn, header: RolloutHeader) -> None:
    """Delete every body, index and marker of the rollout (idempotent)."""
    rid = txn.rollout_id
    for seq in range(header.n_calls):
        call_id = txn.get(seq_key(rid, seq))
        if call_id is None:
            continue
        head = txn.call_head(call_id.decode())
        if head is not None and head.continuation_fingerprint:
            txn.put(fingerprint_key(rid, head.continuation_fingerprint), None)
        txn.put(call_key(rid, call_id.decode()), None)
        txn.put(seq_key(rid, seq), None)
    for seq in range(header.n_incomplete):
        txn.put(incomplete_key(rid, seq), None)
    for seq in range(header.n_started):
        call_id = txn.get(intent_key(rid, seq))
        if call_id is not None:
            txn.put(intent_call_key(rid, call_id.decode()), None)
        txn.put(intent_key(rid, seq), None)


def snapshot_id_for(rollout_id: str, version: int) -> str:
    """Deterministic: the fold is deterministic, so (rollout, version) names one state."""
    return hashlib.sha256(f"tokentrail-snapshot\x00{rollout_id}\x00{version}".encode()).hexdigest()[:32]


def _safe_key(key: bytes | None) -> str | None:
    if key is None:
        return None
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        return key.hex()
