"""The policy version the interceptor knows the engine serves now, and each call's view of it.

``VersionClock`` holds the newest announcement: from the ``tokentrail.policy-versions`` topic
(``announce``, fed by ``schemas.kafka.versions.VersionFollower``) or from the admin route
(``set_admin``, for setups where the trainer cannot reach Kafka). It is read once at dispatch,
once per streamed chunk that carries tokens (an attribute read), and once at completion.

``CallVersions`` is one call's record of it: the version at dispatch, ``(version, tokens
before)`` marks where a stream saw the version change, and the version at completion. What a
mark means (``observed`` spans, ``schemas.policy_versions.observed_spans``): the tokens that
reached the interceptor after it learned of an update are attributed to the new version. That
is exact when the update is announced while the engine is paused (``/pause?mode=keep``) and
before it resumes, and every token generated before the pause reached the interceptor before the
announcement; none generated after the resume can come before it. The first condition is the
trainer's procedure; the second is not guaranteed: vLLM's pause returns 20 ms after the engine
stops, and on a loaded host chunks generated before it were seen to arrive after the
announcement (a CI run, abort mode: 541 tokens of the old weights). A call continued across
aborts is therefore labelled by its parts (``part_ends``), not by its marks
(``producers.capture.call_versions.version_facts``). An engine that reports its own spans (vLLM 0.33
``return_weight_versions``) is always preferred.

A lag never makes a token old: ``tokentrail versions announce`` returns only once every live
interceptor reported it applied the version (``schemas.version_reports``), so the trainer resumes
after this clock moved. An interceptor that reports (``require_lease``) trusts an announced label
only while its lease is fresh (``renew``/``expire``, driven by ``producers.capture.version_feed``):
an announcer that could not see it live would not have waited for it, so past the lease the clock
says None (not known) until a renewal, which comes only after the topic was read to its end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from schemas.policy_versions import PolicyVersion, VersionBook

__all__ = ["CallVersions", "VersionClock"]


class VersionClock:
    """The current announced version (``label``; None: none yet) and where it came from (``origin``)."""

    __slots__ = ("book", "label", "origin", "leased", "fresh")

    def __init__(self) -> None:
        self.book = VersionBook()
        self.label: str | None = None
        self.origin = ""  # "announced" (the topic) or "admin" (the admin route)
        self.leased = False  # announced labels are trusted only while the lease is fresh
        self.fresh = False

    def announce(self, announcement: PolicyVersion) -> None:
        """Fold an announcement from the versions topic in (older steps never move the clock back)."""
        self.book.apply(announcement)
        self.origin = "announced"
        self._show()

    def require_lease(self) -> None:
        """From now on an announced label is current only between ``renew`` and ``expire``."""
        self.leased, self.fresh = True, False
        self._show()

    def renew(self) -> None:
        """The topic was read to its end after a confirmed report: the announced label is trusted again."""
        self.fresh = True
        self._show()

    def expire(self) -> None:
        """The lease ran out: an announcer may not have waited for this interceptor, so the label is not known."""
        self.fresh = False
        self._show()

    @property
    def step(self) -> int | None:
        """The step of the newest announced version this clock applied (None: none)."""
        return self.book.current.step if self.book.current is not None else None

    def _show(self) -> None:
        if self.origin == "announced":
            self.label = self.book.current_label if (self.fresh or not self.leased) else None

    def set_admin(self, label: str | None) -> None:
        """The admin route's label (None clears it): it becomes current at once, the next step up."""
        if label is None:
            self.label, self.origin = self.book.current_label, "announced" if self.book.current else ""
            self._show()
            return
        step = self.book.step_of(label)
        if step is None:
            step = (self.book.current.step + 1) if self.book.current is not None else (
                int(label) if label.isascii() and label.isdigit() and len(label) < 10 else 1)
        self.book.apply(PolicyVersion(label=label, step=step))
        self.label, self.origin = label, "admin"

    def start_call(self) -> CallVersions:
        return CallVersions(dispatch=self.label, marks=[(self.label, 0)])


@dataclass(slots=True)
class CallVersions:
    """One call's view of the clock: at dispatch, where a stream saw it change, at completion."""

    dispatch: str | None
    marks: list[tuple[str | None, int]] = field(default_factory=list)
    completion: str | None = None
    part_ends: list[tuple[int, str | None]] = field(default_factory=list)  # continued: (tokens so far, version)

    def observe(self, label: str | None, tokens_before: int) -> None:
        """A chunk arrived while ``label`` was current; ``tokens_before`` tokens came before it."""
        if label != self.marks[-1][0]:
            self.marks.append((label, tokens_before))
