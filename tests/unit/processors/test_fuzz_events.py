"""Fuzzing the event topic (issue 15 item 2): bad records dead-lettered with a reason, good rollouts unharmed.

Every fuzz input is a partition's log: the records of three good rollouts (``fuzz_events_strategies.GOOD``)
and of a victim rollout, interleaved at random, with garbage among them, folded by ``replay`` (as a
replay of a log, or with Kafka positions as the live worker folds). For every input:

- the fold never raises;
- every garbage record is dead-lettered with a non-empty reason and detail (never a ``FoldError``, the
  fold's catch-all for an exception it did not expect), or it decoded to a valid event and was folded
  (a bit flip can make a valid event with other content: counted as "mutated but valid");
- every good rollout gives, record by record, exactly what it gives folded alone: the same snapshot bytes
  (so the same rebuilt trajectory: token ids, loss mask, log-probs, mask_sample) and the same dead letters,
  wherever the garbage lands;
- a refused record keyed to the victim marks it: every victim snapshot emitted after it is incomplete
  (``invalid_event``) and its rebuild is masked, never delivered.

A record with a wrong key (another valid rollout id, or none) dead-letters against that key: the victim
loses the record without a marker, by design (the fold cannot know whom a mis-keyed record belonged to).
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consumers.rebuild.builder import rebuild
from processors.replay import replay
from processors.state import header_key
from schemas.codec import decode_event, decode_snapshot
from schemas.records import IncompleteReason, MaskCode
from tests.fuzzing import count, fuzz_settings
from tests.unit.processors.fuzz_events_strategies import (
    BASELINE,
    GOOD,
    GOOD_RECORDS,
    RETIRED,
    RETIRED_RECORDS,
    VICTIM,
    VICTIM_RECORDS,
    Outcome,
    absurd_events,
    corruptions,
    fold_alone,
)

pytestmark = pytest.mark.fuzz
# The victim's delivered trajectory when clean (a valid mutation can change it: counted, not asserted).
_VICTIM_CLEAN = rebuild(decode_snapshot(fold_alone(VICTIM_RECORDS).emitted[-1][0])).trajectory


def _interleave(rng: random.Random, queues: dict[str, list]) -> list:
    """Each rollout's records in its order, the rollouts interleaved at random."""
    queues = {k: list(v) for k, v in queues.items() if v}
    out = []
    while queues:
        name = rng.choice(sorted(queues))
        out.append(queues[name].pop(0))
        if not queues[name]:
            del queues[name]
    return out


def _tagged(rid: str, records) -> list[tuple[tuple, bytes | None, bytes | None]]:
    return [((rid, i), key, value) for i, (key, value) in enumerate(records)]


def _fold(log, live: bool):
    return list(replay([(key, value) for _, key, value in log], offsets_from=0 if live else None))


def _good_outcomes(log, steps) -> dict[str, Outcome]:
    per: dict[str, list] = {rid: [] for rid in GOOD}
    for (tag, _, _), step in zip(log, steps):
        if tag[0] in per:
            per[tag[0]].append(step)
    return {rid: Outcome(tuple(tuple(e.data for e in s.result.emitted) for s in ss),
                         tuple(tuple(s.result.deadletters) for s in ss)) for rid, ss in per.items()}


def _assert_good_unharmed(log, steps) -> None:
    got = _good_outcomes(log, steps)
    for rid in GOOD:
        assert got[rid] == BASELINE[rid], f"good rollout {rid} harmed by garbage"
        clean = [d for e in BASELINE[rid].emitted for d in e]
        mixed = [d for e in got[rid].emitted for d in e]
        # The trainer's view, for the record: the rebuilt trajectory of the last snapshot is the same.
        a, b = rebuild(decode_snapshot(clean[-1])), rebuild(decode_snapshot(mixed[-1]))
        assert a.mask_sample == b.mask_sample and a.trajectory == b.trajectory


def _assert_dead_or_folded(test: str, step, label: str) -> bool:
    """Count one garbage record's outcome; True when it was dead-lettered."""
    dead = step.result.deadletters
    if dead:
        for d in dead:
            assert d.reason and d.detail, f"dead letter without a reason: {d!r}"
            assert d.reason != "FoldError", f"the fold raised on a decoded event: {d.detail}"
        count(test, f"dead-lettered {dead[0].reason}{label}")
        return True
    assert step.event() is not None, "a record neither folded (decodable) nor dead-lettered"
    notes = step.result.notes
    count(test, "ignored duplicate" if notes and not step.result.changed else "mutated but valid, folded")
    return False


def _victim_tainted(key: bytes | None, step) -> bool:
    """A refused record that marked the victim (keyed to it, or unkeyed and naming it)."""
    return key == VICTIM.encode() or (key is None and header_key(VICTIM) in step.result.writes)


def _check_victim_snapshot(test: str, data: bytes, tainted: bool, lost_unmarked: bool) -> None:
    snap = decode_snapshot(data)
    out = rebuild(snap)
    if tainted:
        assert snap.incomplete and IncompleteReason.INVALID_EVENT in [m.reason for m in snap.incomplete_markers]
        assert out.mask_sample and MaskCode.CAPTURE_INCOMPLETE in [r.code for r in out.mask_reasons], \
            "a rollout with a refused record was delivered unmasked"
        count(test, "victim snapshot masked (invalid_event)")
    elif out.mask_sample:
        count(test, "victim snapshot masked (other reason)")
    elif lost_unmarked:
        count(test, "victim delivered, its loss mis-keyed")
    else:
        count(test, "victim delivered" if out.trajectory == _VICTIM_CLEAN
              else "victim delivered, changed by a valid mutation")


# ------------------------------------------------------------------ 1. corrupted records of a rollout

@pytest.mark.fuzz
@fuzz_settings()
@given(corrs=st.lists(st.tuples(corruptions(), st.booleans()), min_size=1, max_size=4),
       rng=st.randoms(use_true_random=False), live=st.booleans())
def test_corrupted_records_are_dead_lettered_and_good_rollouts_unharmed(corrs, rng, live):
    test = "corrupted records"
    victim = _tagged(VICTIM, VICTIM_RECORDS)
    inserted = []
    for n, ((index, key, value, kind, key_kind), replace) in enumerate(corrs):
        item = (("garbage", n, kind, key_kind), key, value)
        if replace and victim[index][0][0] == VICTIM:
            victim[index] = item  # the original is lost: only its corruption reaches the topic
        else:
            inserted.append(item)
    queues = {rid: _tagged(rid, recs) for rid, recs in GOOD_RECORDS.items()}
    log = _interleave(rng, {**queues, VICTIM: victim})
    for item in inserted:
        log.insert(rng.randint(0, len(log)), item)

    steps = _fold(log, live)  # never raises

    _assert_good_unharmed(log, steps)
    tainted = lost_unmarked = False
    for (tag, key, _), step in zip(log, steps):
        if tag[0] == "garbage":
            label = "" if tag[3] == "victim" else f" ({tag[3]} key)"
            if _assert_dead_or_folded(test, step, label):
                if _victim_tainted(key, step):
                    tainted = True
                else:
                    lost_unmarked = True
        for emitted in step.result.emitted:
            if emitted.rollout_id == VICTIM:
                _check_victim_snapshot(test, emitted.data, tainted, lost_unmarked)


# ------------------------------------------------------------------ 2. valid envelopes, absurd fields

# What a refusal names, per mutated field: the field itself, or the check it fails.
_HINTS = {
    "envelope.rollout_id": ["rollout id", "rollout_id"],
    "envelope.schema_version": ["schema_version"],
    "CallCaptured.model_call_id": ["model_call_id"],
    "CallStarted.model_call_id": ["model_call_id"],
    "CallIncomplete.model_call_id": ["model_call_id"],
    "CallCaptured.prompt_token_ids": ["prompt_token_ids", "multiple of item size", "cum_len"],
    "CallCaptured.generation_token_ids": ["generation_token_ids", "multiple of item size", "cum_len"],
    "CallCaptured.generation_log_probs": ["generation_log_probs", "multiple of item size"],
    "CallCaptured.cum_len": ["cum_len"],
    "CallCaptured.parent_call_id": ["parent_call_id", "parent_resolution"],
    "CallCaptured.parent_resolution": ["parent_resolution", "prompt_is_delta"],
    "CallCaptured.prompt_is_delta": ["prompt_is_delta", "cum_len"],
    # A valid finish with another payload than the rollout's first (which another mutated finish may have
    # been): refused as a conflict naming the fields that differ (tests/unit/processors/test_finish_once.py).
    "RolloutFinished.result_json": ["field 'result'", "conflicts with its first finish"],
    "RolloutFinished.attempt": ["field 'attempt'", "conflicts with its first finish"],
    "RolloutFinished.final_text": ["field 'final_text'", "conflicts with its first finish"],
    "RolloutFinished.final_response_id": ["field 'final_response_id'", "conflicts with its first finish"],
}
# Refusals that lose no evidence of the rollout's calls, so they mark nothing: a late writer of a retired
# attempt, and a finish that conflicts with the first (that record stands; issue 25).
_NO_TAINT = ("write_after_retire", "conflicting_finish")


@pytest.mark.fuzz
@fuzz_settings()
@given(absurd=st.lists(absurd_events(), min_size=1, max_size=4), rng=st.randoms(use_true_random=False),
       live=st.booleans())
def test_absurd_fields_are_dead_lettered_naming_the_problem_and_good_rollouts_unharmed(absurd, rng, live):
    test = "absurd fields"
    garbage = [(("garbage", n, fields), key, value) for n, (key, value, fields) in enumerate(absurd)]
    queues = {rid: _tagged(rid, recs) for rid, recs in GOOD_RECORDS.items()}
    log = _interleave(rng, {**queues, VICTIM: _tagged(VICTIM, VICTIM_RECORDS)})
    for item in garbage:
        log.insert(rng.randint(0, len(log)), item)
    log = _tagged(RETIRED, RETIRED_RECORDS) + log  # retired before any garbage arrives

    steps = _fold(log, live)  # never raises

    _assert_good_unharmed(log, steps)
    tainted = False
    for (tag, key, value), step in zip(log, steps):
        if tag[0] == "garbage":
            fields = tag[2]
            target = _target(key, value)
            if _assert_dead_or_folded(test, step, "" if target != RETIRED else " (retired rollout)"):
                (dead,) = step.result.deadletters  # exactly one per refused record
                # Any finish may conflict with the rollout's first, which another mutated finish may have been
                # (a finish whose event id was mutated is a finish all the same): refused conflicting_finish.
                hints = [h for f in fields for h in _HINTS.get(f, [])] + ["differs from rollout_id",
                                                                            "write_after_retire", "conflicting_finish"]
                assert any(h in dead.detail or h == dead.reason for h in hints), \
                    f"the refusal of {fields} names none of them: {dead}"
                if _victim_tainted(key, step) and dead.reason not in _NO_TAINT:
                    tainted = True
            elif target == RETIRED:
                assert type(step.event().body).__name__ == "RetireRequested", \
                    f"a write to a retired rollout was folded silently: {fields}"
                assert step.result.notes == ["already retired"] and not step.result.changed
        for emitted in step.result.emitted:
            assert emitted.rollout_id != RETIRED or tag[0] == RETIRED, "a retired rollout emitted again"
            if emitted.rollout_id == VICTIM:
                _check_victim_snapshot(test, emitted.data, tainted, False)


def _target(key: bytes | None, value: bytes) -> str | None:
    if key is not None:
        try:
            return key.decode()
        except UnicodeDecodeError:
            return None
    try:
        return decode_event(value).rollout_id
    except Exception:
        return None


# ------------------------------------------------------------------ 3. where the garbage lands

@pytest.mark.fuzz
@fuzz_settings()
@given(corrs=st.lists(corruptions(), min_size=1, max_size=3), absurd=st.lists(absurd_events(), max_size=2),
       rng1=st.randoms(use_true_random=False), rng2=st.randoms(use_true_random=False))
def test_good_rollouts_do_not_depend_on_where_the_garbage_lands(corrs, absurd, rng1, rng2):
    garbage = [(("garbage", n), key, value) for n, (_, key, value, _, _) in enumerate(corrs)]
    garbage += [(("garbage", len(corrs) + n), key, value) for n, (key, value, _) in enumerate(absurd)]
    queues = {rid: _tagged(rid, recs) for rid, recs in GOOD_RECORDS.items()}
    outcomes = []
    for rng in (rng1, rng2):
        log = _interleave(rng, queues)
        for item in garbage:
            log.insert(rng.randint(0, len(log)), item)
        outcomes.append(_good_outcomes(log, _fold(log, live=False)))
    assert outcomes[0] == outcomes[1] == BASELINE
    count("garbage placement", f"{len(garbage)} garbage records, good rollouts identical")
