"""One record per rollout attempt: the fold is the authority on a rollout's finish (issue 25, item 3).

The first RolloutFinished freezes the rollout and emits its snapshot; the consumer may deliver it at once,
so nothing a later finish does can take it back. A second finish therefore never mints a second record:

* the same payload (a re-sent finish) changes nothing and emits nothing;
* another payload (another reward, another final answer, another attempt number) is a conflict: it is
  dead-lettered ``conflicting_finish`` naming both finishes, the state is untouched, so the record the
  first finish froze stands and its retirement still applies;
* after retirement, a finish is dead-lettered ``write_after_retire`` saying its result was not delivered.

Before the fix a finish with another payload froze a second, unmasked snapshot with the other result
(the rollout was delivered twice, with conflicting rewards), and a repeated finish emitted its
snapshot again.
"""

from __future__ import annotations

import pytest

from processors.replay import MemoryState, replay
from processors.state import header_key
from schemas.codec import encode_event
from tests.factories import event, finished, make_call, retire

R = "rollout-once"


class Log:
    """One partition: events get consecutive offsets; any of them can be delivered again."""

    def __init__(self) -> None:
        self.records: list[bytes] = []
        self.state = MemoryState()

    def publish(self, *events):
        out = []
        for ev in events:
            self.records.append(encode_event(ev))
            out.append(self.deliver(len(self.records) - 1))
        return out

    def deliver(self, offset: int):
        (step,) = replay([(R.encode(), self.records[offset])], state=self.state, offsets_from=offset)
        return step.result


def frozen_log(result=None, **kw):
    log = Log()
    call = make_call([1, 2, 3], [4, 5])
    _, fin = log.publish(event(R, call), event(R, finished(result or {"reward": 1}, **kw), event_id="fin-first"))
    (snap,) = fin.snapshots
    return log, snap


def test_a_second_finish_with_the_same_payload_emits_no_second_record():
    log, snap = frozen_log()
    before = dict(log.state)
    (again,) = log.publish(event(R, finished({"reward": 1}), event_id="fin-again"))
    assert again.emitted == [] and again.deadletters == [] and not again.changed
    assert log.state == before
    assert any("duplicate finish" in note for note in again.notes), again.notes
    (ret,) = log.publish(event(R, retire(snap.snapshot_id, snap.version)))
    assert ret.changed and log.state.retired(R)


@pytest.mark.parametrize("second", [
    finished({"reward": 0}),
    finished({"reward": 1}, final_text="another answer"),
    finished({"reward": 1}, final_response_id="chatcmpl-ttother"),
    finished({"reward": 1}, attempt=1),
], ids=["result", "final_text", "final_response_id", "attempt"])
def test_a_finish_with_another_payload_is_dead_lettered_and_the_first_record_stands(second):
    log, snap = frozen_log()
    before = dict(log.state)
    (conflict,) = log.publish(event(R, second, event_id="fin-second"))
    assert conflict.emitted == [], "never a second record for one attempt"
    # Only the header changed: it keeps the refused finish's event id, not its payload, at the same version.
    assert set(conflict.writes) == {header_key(R)} and {k: v for k, v in log.state.items() if k != header_key(R)} \
        == {k: v for k, v in before.items() if k != header_key(R)}
    header = log.state.header(R)
    assert (header.version, header.snapshot_id, header.finished.result) == (snap.version, snap.snapshot_id,
                                                                             {"reward": 1})
    (dead,) = conflict.deadletters
    assert dead.reason == "conflicting_finish" and dead.rollout_id == R
    # Names both finishes, what differs, what stands, and the fix.
    for needle in ("fin-second", "fin-first", snap.snapshot_id, "new rollout id"):
        assert needle in dead.detail, (needle, dead.detail)
    differing = next(f for f in ("result", "final_text", "final_response_id", "attempt")
                     if f"'{f}" in dead.detail)
    assert differing, dead.detail
    # The record the consumer already holds is still the rollout's: its retirement applies.
    (ret,) = log.publish(event(R, retire(snap.snapshot_id, snap.version)))
    assert ret.changed and log.state.retired(R)


def test_a_conflicting_finish_redelivered_repeats_only_its_dead_letter_and_a_copy_adds_nothing():
    log, _ = frozen_log()
    second = event(R, finished({"reward": 0}), event_id="fin-second")
    log.publish(second)
    again = log.deliver(len(log.records) - 1)  # at-least-once: the same record again
    assert again.emitted == [] and not again.changed
    assert [d.reason for d in again.deadletters] == ["conflicting_finish"]
    (copy,) = log.publish(second)  # the same event re-published (a producer retry): already refused
    assert copy.emitted == [] and copy.deadletters == [] and not copy.changed


def test_a_conflicting_finish_after_late_writes_does_not_refreeze():
    log, snap = frozen_log()
    late = make_call([1, 2, 3, 4, 5, 6], [7])
    log.publish(event(R, late))  # evidence after the freeze: kept, the version moves on
    (conflict,) = log.publish(event(R, finished({"reward": 0}), event_id="fin-second"))
    assert conflict.emitted == [] and [d.reason for d in conflict.deadletters] == ["conflicting_finish"]
    # The same payload again still re-freezes, so the late evidence is reported (masked late_write).
    (same,) = log.publish(event(R, finished({"reward": 1}), event_id="fin-third"))
    (refrozen,) = same.snapshots
    assert refrozen.version > snap.version and refrozen.late_writes == 1
    assert refrozen.finished.result == {"reward": 1}


def test_no_two_finishes_ever_give_two_records_with_different_results():
    """Any order of finishes, any repeats: one result reaches the snapshots topic (the first one)."""
    payloads = [{"reward": 1}, {"reward": 0}, {"reward": 1}, {"reward": 0.5}, {"reward": 0}]
    log = Log()
    log.publish(event(R, make_call([1, 2, 3], [4, 5])))
    results = []
    for n, payload in enumerate(payloads):
        (res,) = log.publish(event(R, finished(payload), event_id=f"fin-{n}"))
        results.extend(s.finished.result for s in res.snapshots)
    assert results == [{"reward": 1}]


def test_a_finish_after_retirement_is_dead_lettered_saying_its_result_was_not_delivered():
    log, snap = frozen_log()
    log.publish(event(R, retire(snap.snapshot_id, snap.version)))
    (late,) = log.publish(event(R, finished({"reward": 0}), event_id="fin-reused"))
    assert late.emitted == []
    (dead,) = late.deadletters
    assert dead.reason == "write_after_retire"
    for needle in ("RolloutFinished", "fin-reused", "not delivered", snap.snapshot_id, "new rollout id"):
        assert needle in dead.detail, (needle, dead.detail)
    assert log.state.header(R).writes_after_retire == 1 and list(log.state) == [header_key(R)]
