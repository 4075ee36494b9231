"""Which interceptors applied an announced policy version: their reports, and the announcer's wait (pure).

Why: an interceptor labels each streamed token with the version it knows the engine serves
(``producers.capture.version_clock``). It learns of an announcement from the policy-versions
topic some milliseconds after the announcer's record was acknowledged (15-19 ms on a quiet
host, 45-85 ms with the CPU loaded, no bound in general). Had the trainer resumed the engine in
that window, the tokens sampled after the resume would be labelled with the old version. So the
trainer's announcement returns only once every live interceptor has *applied* it, and an
interceptor that could not confirm in time stops trusting its label.

The protocol, two rules that make a label never lag by construction:

* **Reports.** Every interceptor that follows the versions topic publishes an ``AppliedReport``
  (keyed by its ``instance`` id, on the compacted ``tokentrail.policy-versions-applied`` topic):
  right after it applied a new version, and every ``heartbeat`` seconds. ``step`` is the highest
  step its clock applied; ``at`` its wall clock when it sent the report; ``lease_s`` how long it
  trusts its label after ``at`` without a newer confirmed report. A clean stop publishes a
  tombstone. ``announce`` waits (``Confirmations``) until every *live* instance reports
  ``step >= `` the announced step; one that does not within the timeout is named in the error.
* **Lease.** An instance is live while ``now <= at + lease_s + skew_s`` (``skew_s``: the most the
  two wall clocks may differ). The interceptor, for its part, trusts its label only until
  ``at + lease_s`` (its own monotonic clock), and renews that only after a report was acknowledged
  *and* it then read the versions topic up to its end. So an instance the announcer left out
  (no live report) had stopped trusting its label before the announcement, and can trust it again
  only after it applied the announcement: its tokens in between are of unknown version, never of
  the old one (``producers.capture.version_feed``).

Pure: standard library only.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from schemas.errors import ContractError

__all__ = ["DEFAULT_HEARTBEAT_S", "DEFAULT_LEASE_S", "DEFAULT_SKEW_S", "AppliedReport", "Confirmations",
           "decode_report", "encode_report"]

DEFAULT_HEARTBEAT_S = 1.0  # an interceptor reports at least this often
DEFAULT_LEASE_S = 5.0  # ...and trusts its label this long after a report (several heartbeats: one lost is no gap)
DEFAULT_SKEW_S = 2.0  # the announcer's allowance for the difference between its wall clock and an interceptor's
_KIND = "tokentrail.applied-version/1"


@dataclass(frozen=True, slots=True)
class AppliedReport:
    """One interceptor's report: it applied ``step`` (``label``; None: no version yet), sent at ``at``."""

    instance: str
    step: int | None
    label: str | None
    at: float
    lease_s: float = DEFAULT_LEASE_S

    def __post_init__(self) -> None:
        if not isinstance(self.instance, str) or not self.instance:
            raise ContractError(f"applied report instance={self.instance!r}: must be a non-empty string")
        if self.step is not None and (not isinstance(self.step, int) or isinstance(self.step, bool) or self.step < 0):
            raise ContractError(f"applied report of {self.instance!r}: step={self.step!r} must be an integer >= 0 "
                                "or null")
        for name in ("at", "lease_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ContractError(f"applied report of {self.instance!r}: {name}={value!r} must be a finite "
                                    "number >= 0")

    def live_until(self, skew_s: float) -> float:
        """The announcer's wall-clock time after which this instance no longer trusts the label it reported."""
        return self.at + self.lease_s + skew_s


def encode_report(report: AppliedReport) -> bytes:
    return json.dumps({"kind": _KIND, "instance": report.instance, "step": report.step, "label": report.label,
                       "at": report.at, "lease_s": report.lease_s}, separators=(",", ":")).encode("utf-8")


def decode_report(value: bytes) -> AppliedReport:
    """ContractError naming the field for anything that is not a report this reader knows."""
    try:
        doc = json.loads(value)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ContractError(f"applied report is not JSON ({exc}); the reports topic holds only "
                            f"{_KIND!r} records") from exc
    if not isinstance(doc, dict) or doc.get("kind") != _KIND:
        kind = doc.get("kind") if isinstance(doc, dict) else type(doc).__name__
        raise ContractError(f"applied report kind={kind!r}: expected {_KIND!r} (a newer writer? upgrade this reader)")
    try:
        return AppliedReport(instance=doc["instance"], step=doc["step"], label=doc.get("label"), at=doc["at"],
                             lease_s=doc.get("lease_s", DEFAULT_LEASE_S))
    except KeyError as exc:
        raise ContractError(f"applied report lacks the field {exc.args[0]!r}") from exc


class Confirmations:
    """The announcer's fold of the reports topic: which live interceptors applied ``step``.

    ``note`` each report (``gone`` for a tombstone), in topic order, then ask ``settle(now)``
    once the topic was read to its end: the instances live then are *expected*, and so is any
    that becomes live later; an expected one must confirm, even if it stops reporting (a crash
    is named, not waited out). ``done`` once every expected instance confirmed and at least
    ``min_followers`` did.
    """

    def __init__(self, step: int, *, skew_s: float = DEFAULT_SKEW_S, min_followers: int = 0) -> None:
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ContractError(f"step={step!r} must be an integer >= 0")
        if not isinstance(min_followers, int) or isinstance(min_followers, bool) or min_followers < 0:
            raise ContractError(f"min_followers={min_followers!r} must be an integer >= 0")
        if not math.isfinite(skew_s) or skew_s < 0:
            raise ContractError(f"skew_s={skew_s!r} must be a finite number >= 0")
        self.step, self.skew_s, self.min_followers = step, skew_s, min_followers
        self.latest: dict[str, AppliedReport] = {}
        self.expected: set[str] = set()
        self.settled = False

    def note(self, report: AppliedReport, now: float) -> None:
        kept = self.latest.get(report.instance)
        if kept is None or report.at >= kept.at:
            self.latest[report.instance] = report
        if self.settled and report.live_until(self.skew_s) >= now:
            self.expected.add(report.instance)  # started (or came back) during the wait: it must confirm too

    def gone(self, instance: str) -> None:
        """A clean stop (tombstone): the instance labels nothing any more, nothing to wait for."""
        self.latest.pop(instance, None)
        self.expected.discard(instance)

    def settle(self, now: float) -> None:
        """The topic was read to its end: every instance live now is expected to confirm."""
        if not self.settled:
            self.settled = True
            self.expected |= {i for i, r in self.latest.items() if r.live_until(self.skew_s) >= now}

    def confirmed(self) -> list[str]:
        return sorted(i for i in self.expected if self._applied(i))

    def missing(self) -> list[str]:
        return sorted(i for i in self.expected if not self._applied(i))

    def done(self) -> bool:
        return self.settled and not self.missing() and len(self.confirmed()) >= self.min_followers

    def _applied(self, instance: str) -> bool:
        report = self.latest.get(instance)
        return report is not None and report.step is not None and report.step >= self.step

    def explain(self, now: float, waited_s: float) -> str:
        """Why ``done`` is still False after ``waited_s``: each instance that did not confirm, and the fix."""
        parts = []
        for instance in self.missing():
            r = self.latest[instance]
            age = now - r.at
            has = "no version" if r.step is None else f"step {r.step} ({r.label!r})"
            dead = " (no report since: stopped or cut off from the broker?)" if age > r.lease_s / 2 else ""
            parts.append(f"{instance} (last report {age:.1f} s ago, applied {has}{dead})")
        why = []
        if parts:
            why.append(f"{len(parts)} of {len(self.expected)} live interceptor(s) did not confirm they applied step "
                       f"{self.step} within {waited_s:.1f} s: " + ", ".join(parts))
        if len(self.confirmed()) < self.min_followers:
            why.append(f"{len(self.confirmed())} interceptor(s) confirmed, min_followers={self.min_followers} are "
                       "required (are they following the versions topic, with the reports topic created by "
                       "`tokentrail topics`?)")
        return "; ".join(why) or "waiting for the reports topic to be read"

