"""The rollouts this interceptor finished, so it can refuse what would be dropped at once (pure: no framework).

One record per rollout attempt: the processor's fold is the authority (``processors.fold``: the first
finish decides the result; a finish with another payload is dead-lettered ``conflicting_finish``; any
write after retirement ``write_after_retire``). Each of those is a request the harness or trainer was
answered 200 for, and lost. The interceptor knows the finishes it acknowledged itself, on its finish route
(``producers.http.control``), and answers from this book, before anything is published or forwarded:

* the same finish again: 200, nothing published (the first finish's event id, ``"duplicate": true``);
* a finish with another payload (result, final answer or attempt): 409 naming the fields that differ;
* a capture call under ``/ng-rollout/<id>/training-token-capture/`` of a finished rollout: 409 naming
  the rule (``producers.http.app``); nothing recorded or forwarded.

A finish is in the book once Kafka (or the spool) acknowledged it; while it is in flight a conflicting
finish is already refused (two different finishes at once would race at the fold), while calls are not.
A finish that could not be made durable leaves no entry.

Bounded: at most ``max_rollouts`` entries (setting ``finished_max_rollouts``), the oldest finish
evicted first; an entry is the rollout id and one ``bytes`` of 32 bytes of field digests plus the
finish's event id: about 230 bytes with a 30-character id (``tests/unit/producers/test_finish_once.py``
measures it), so the default 65,536 entries hold about 15 MB. The per-call check is one dict lookup.

What it cannot know, the fold still catches (fail closed: never delivered, never delivered twice): a
rollout finished elsewhere (``tokentrail finish``, ``producers.finish.finish_rollout``, another
interceptor), before this process started, or evicted from the book. Its later calls are captured and
then kept as late evidence (the rollout's next record is masked ``late_write``) or, after retirement,
dead-lettered ``write_after_retire``; its conflicting finish is dead-lettered ``conflicting_finish``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from schemas.records import RolloutFinished

__all__ = ["FINISH_FIELD_ATTRS", "FinishedRollouts", "Prior", "finished_call_message", "payload_digest"]

# RolloutFinished's fields as the finish body names them (``producers.finish.FINISH_FIELDS``), with the
# record's attribute for each.
FINISH_FIELD_ATTRS = (("result", "result_json"), ("final_response_id", "final_response_id"),
                 ("final_text", "final_text"), ("attempt", "attempt"))
_PART = 8  # digest bytes per field
_DIGEST = _PART * len(FINISH_FIELD_ATTRS)


@dataclass(frozen=True, slots=True)
class Prior:
    """What the book knows of a rollout's earlier finish."""

    event_id: str | None  # None: its publish is still in flight
    differs: tuple[str, ...]  # the finish body's fields where a new finish differs from it; () the same payload


def payload_digest(body: RolloutFinished) -> bytes:
    """8 bytes of BLAKE2b per field, in ``FINISH_FIELD_ATTRS`` order: equal payloads, equal digests."""
    return b"".join(hashlib.blake2b(repr(getattr(body, attr)).encode("utf-8", "surrogatepass"),
                                    digest_size=_PART).digest() for _, attr in FINISH_FIELD_ATTRS)


class FinishedRollouts:
    """Rollout id -> the finish this interceptor acknowledged (or is publishing); FIFO-bounded."""

    def __init__(self, max_rollouts: int = 65_536) -> None:
        if max_rollouts < 1:
            raise ValueError(f"finished_max_rollouts={max_rollouts!r} must be at least 1")
        self.max_rollouts = max_rollouts
        self._entries: dict[str, bytes] = {}  # digest, then the event id once acknowledged

    def __len__(self) -> int:
        return len(self._entries)

    def finished(self, rollout_id: str) -> str | None:
        """The event id of the rollout's acknowledged finish; None when none is known (the per-call check)."""
        entry = self._entries.get(rollout_id)
        if entry is None or len(entry) == _DIGEST:
            return None
        return entry[_DIGEST:].decode()

    def begin(self, rollout_id: str, body: RolloutFinished) -> Prior | None:
        """Before publishing a finish: None when none is known (it is now in flight, ``acknowledged`` or
        ``failed`` must follow); else what is known of the earlier one."""
        digest = payload_digest(body)
        entry = self._entries.get(rollout_id)
        if entry is None:
            self._put(rollout_id, digest)
            return None
        differs = tuple(name for n, (name, _) in enumerate(FINISH_FIELD_ATTRS)
                        if entry[n * _PART:(n + 1) * _PART] != digest[n * _PART:(n + 1) * _PART])
        return Prior(event_id=entry[_DIGEST:].decode() or None, differs=differs)

    def acknowledged(self, rollout_id: str, body: RolloutFinished, event_id: str) -> None:
        """The finish is durable: calls of the rollout are refused from now on."""
        digest = payload_digest(body)
        entry = self._entries.get(rollout_id)
        if entry is None or (len(entry) == _DIGEST and entry == digest):
            self._put(rollout_id, digest + event_id.encode())

    def failed(self, rollout_id: str, body: RolloutFinished) -> None:
        """The finish begun could not be made durable: forget it, unless another finish was acknowledged."""
        entry = self._entries.get(rollout_id)
        if entry is not None and entry == payload_digest(body):
            del self._entries[rollout_id]

    def _put(self, rollout_id: str, entry: bytes) -> None:
        self._entries.pop(rollout_id, None)
        self._entries[rollout_id] = entry
        while len(self._entries) > self.max_rollouts:
            del self._entries[next(iter(self._entries))]


def finished_call_message(rollout_id: str, event_id: str) -> str:
    """The 409 of a capture call for a rollout this interceptor finished: the rule, and the fix."""
    return (f"rollout {rollout_id!r} is finished: this interceptor acknowledged its RolloutFinished (event "
            f"{event_id}). A rollout id names one attempt and a finished rollout takes no more calls: its record "
            "is frozen, and a call captured now could never be part of it. Run the next attempt under a new "
            "rollout id (e.g. '<id>.a1'); nothing was recorded or forwarded")
