"""Policy versions: the trainer's announcements, the book that orders them, per-token version spans.

A policy version is an opaque label (vLLM's weight version: ``"default"`` until a trainer names
one). The trainer announces each update once as a ``PolicyVersion`` (label + step) on the
compacted ``tokentrail.policy-versions`` topic, keyed by label; interceptors and consumers fold
the topic into a ``VersionBook``. Steps order labels: staleness is "current step minus the step of
the oldest generated token's version". A label nobody announced has no step, so its staleness is
unknown (a consumer that bounds staleness masks it, it never guesses). vLLM's unnamed
``"default"`` weights are step 0 unless announced otherwise.

Span helpers build a call's run-length ``VersionSpan`` list over its generated tokens from the
three sources of ``VersionSource``; each returns spans that cover ``[0, n)`` exactly or ``[]``.
Pure: no framework imports.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

from schemas.errors import ContractError
from schemas.records import VersionSpan

__all__ = ["MAX_LABEL_CHARS", "MAX_STEP", "UNNAMED_VERSION", "UNKNOWN_VERSION", "PolicyVersion",
           "announcement_problem", "VersionBook", "bracket_spans", "engine_spans",
           "merge_spans", "observed_spans", "part_spans", "shifted", "versions_of"]

UNNAMED_VERSION = "default"  # vLLM's label of weights no trainer has named (vllm/v1/engine/core.py)
UNKNOWN_VERSION = ""  # a span whose tokens' version is not known (bracketed across an update)
MAX_STEP = 2**63 - 1  # an Avro long
MAX_LABEL_CHARS = 256  # a label is a key on the topic, a log field and a metric label: a name, not a document
MAX_WEIGHTS_CHARS = 1024


def announcement_problem(label: str, step: int, weights: str = "") -> str | None:
    """Why a trainer may not announce ``label`` at ``step`` (one line naming the field, the value and the fix).

    Stricter than ``PolicyVersion`` (which also reads what is already on the topic): a label is printable
    text (no newline, no control character, no lone surrogate: what a shell makes of bytes that are not
    UTF-8) of at most ``MAX_LABEL_CHARS``; ``"default"``, vLLM's unnamed weights, is step 0 only.
    """
    shown = repr(label[:60]) + ("..." if len(label) > 60 else "")
    if not isinstance(label, str) or not label:
        return f"label={label!r}: must be a non-empty string (the engine's weight version label, e.g. 'step-12')"
    if len(label) > MAX_LABEL_CHARS:
        return (f"label={shown} has {len(label)} characters: at most {MAX_LABEL_CHARS}; use a short name such as "
                "'step-12' and put the details in --weights")
    if not label.isprintable():
        return (f"label={shown}: must be printable UTF-8 text, without newlines, control characters or bytes "
                "that are not UTF-8; use a name such as 'step-12'")
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= MAX_STEP:
        return f"step={step!r}: must be an integer with 0 <= step < 2**63 (the trainer's update count)"
    if label == UNNAMED_VERSION and step != 0:
        return (f"label={label!r} at step={step}: {UNNAMED_VERSION!r} names vLLM's unnamed initial weights, step 0 "
                "only; announce updated weights under a label of their own, e.g. 'step-{step}'")
    if not isinstance(weights, str) or len(weights) > MAX_WEIGHTS_CHARS or not weights.isprintable():
        return (f"weights={weights[:60]!r}: must be printable UTF-8 text of at most {MAX_WEIGHTS_CHARS} characters, "
                "without newlines (free text: how the weights reached the engine)")
    return None


@dataclass(frozen=True, slots=True)
class PolicyVersion:
    """One announcement: from now on the engine serves ``label``, the trainer's ``step``.

    ``announced_at`` is the announcer's wall clock (seconds); ``weights`` says how the weights
    reached the engine (e.g. ``"collective_rpc:reload_weights"``, ``"label-only"``; free text).
    """

    label: str
    step: int
    announced_at: float = 0.0
    weights: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.label, str) or not self.label or self.label == UNKNOWN_VERSION:
            raise ContractError(f"policy version label={self.label!r}: must be a non-empty string")
        if not isinstance(self.step, int) or isinstance(self.step, bool) or not 0 <= self.step <= MAX_STEP:
            raise ContractError(f"policy version {self.label!r}: step={self.step!r} must be an integer with "
                                "0 <= step < 2**63 (the trainer's update count; it orders versions for staleness)")
        if not math.isfinite(self.announced_at):
            raise ContractError(f"policy version {self.label!r}: announced_at={self.announced_at!r} is not finite")


class VersionBook:
    """Every announced label's step, and the current version (the highest step; later wins a tie).

    ``apply`` is idempotent and order-insensitive over a topic's records, except that a label
    re-announced with another step takes the latest announcement.
    """

    __slots__ = ("_steps", "current", "announcements")

    def __init__(self, announcements: Iterable[PolicyVersion] = ()) -> None:
        self._steps: dict[str, int] = {}
        self.current: PolicyVersion | None = None
        self.announcements = 0
        for a in announcements:
            self.apply(a)

    def apply(self, announcement: PolicyVersion) -> bool:
        """Fold one announcement in; True when the current version changed."""
        self.announcements += 1
        self._steps[announcement.label] = announcement.step
        cur = self.current
        if cur is None or announcement.step >= cur.step or announcement.label == cur.label:
            changed = cur is None or cur.label != announcement.label
            self.current = announcement
            return changed
        return False

    def step_of(self, label: str) -> int | None:
        """The label's step; ``"default"`` is 0 unless announced; None: never announced (unknown)."""
        step = self._steps.get(label)
        if step is None and label == UNNAMED_VERSION:
            return 0
        return step

    def steps(self) -> dict[str, int]:
        """Every announced label and its step (a copy)."""
        return dict(self._steps)

    @property
    def current_label(self) -> str | None:
        return self.current.label if self.current is not None else None

    def staleness(self, labels: Iterable[str]) -> int | None:
        """Versions the oldest of ``labels`` is behind the current one; None when any is unknown.

        No labels (nothing named a version) or no announcement at all: None.
        """
        if self.current is None:
            return None
        steps = [self.step_of(label) for label in labels]
        known = [s for s in steps if s is not None]
        if not steps or len(known) != len(steps):
            return None
        return max(0, self.current.step - min(known))


# -- spans -------------------------------------------------------------------------------------
def merge_spans(spans: Iterable[VersionSpan]) -> list[VersionSpan]:
    """Run-length form: empty spans dropped, adjacent spans of one version joined."""
    out: list[VersionSpan] = []
    for s in spans:
        if s.end <= s.start:
            continue
        if out and out[-1].version == s.version and out[-1].end == s.start:
            out[-1] = VersionSpan(version=s.version, start=out[-1].start, end=s.end)
        else:
            out.append(s)
    return out


def _is_int(x: object) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool)


def engine_spans(value: Any, n: int) -> list[VersionSpan]:
    """The engine's ``weight_versions`` (``[{"version", "start", "end"}]``) checked against ``n`` tokens.

    ValueError naming the problem unless they cover ``[0, n)`` exactly, in order.
    """
    if not isinstance(value, list):
        raise ValueError(f"weight_versions must be a list of spans, got {type(value).__name__}")
    spans: list[VersionSpan] = []
    at = 0
    for i, raw in enumerate(value):
        if not isinstance(raw, dict):
            raise ValueError(f"weight_versions[{i}] must be an object with version, start and end")
        version, start, end = raw.get("version"), raw.get("start"), raw.get("end")
        if not isinstance(version, str) or not version:
            raise ValueError(f"weight_versions[{i}].version={version!r}: must be a non-empty string")
        if not (_is_int(start) and _is_int(end)):
            raise ValueError(f"weight_versions[{i}]: start={start!r} and end={end!r} must be integers")
        if start != at or end < start:
            raise ValueError(f"weight_versions[{i}] = [{start}, {end}) does not continue at token {at}")
        spans.append(VersionSpan(version=version, start=start, end=end))
        at = end
    if at != n:
        raise ValueError(f"weight_versions cover {at} tokens of a generation of {n}")
    return merge_spans(spans)


def observed_spans(marks: Sequence[tuple[str | None, int]], n: int) -> list[VersionSpan]:
    """Spans from ``(version, tokens seen before it took effect)`` marks, in arrival order.

    Each mark says: from token index ``at`` on, the announced version was ``version`` (None:
    none announced yet: not known). Tokens before the first mark have the first mark's version.
    """
    if not marks:
        return []
    spans: list[VersionSpan] = []
    for i, (version, at) in enumerate(marks):
        start = 0 if i == 0 else min(at, n)
        end = min(marks[i + 1][1], n) if i + 1 < len(marks) else n
        spans.append(VersionSpan(version=version or UNKNOWN_VERSION, start=start, end=max(start, end)))
    merged = merge_spans(spans)
    return [] if all(s.version == UNKNOWN_VERSION for s in merged) else merged


def bracket_spans(dispatch: str | None, completion: str | None, n: int) -> list[VersionSpan]:
    """One span when the version at dispatch and at completion agree; an unknown one when not."""
    if n <= 0 or (dispatch is None and completion is None):
        return []
    version = dispatch if dispatch == completion else UNKNOWN_VERSION
    return [VersionSpan(version=version or UNKNOWN_VERSION, start=0, end=n)]


def part_spans(dispatch: str | None, part_ends: Sequence[tuple[int, str | None]], completion: str | None,
               n: int) -> list[VersionSpan]:
    """Spans of a generation continued across engine aborts, from the version at each part's end.

    Part 0 is bracketed by the dispatch version and the version when it was aborted. A later
    part was sent while the engine was paused and generated after it resumed, up to its own
    abort or end: it has the one version current at its end (announced before the resume).
    """
    bounds = [0, *(min(at, n) for at, _ in part_ends), n]
    labels = [label for _, label in part_ends] + [completion]
    spans: list[VersionSpan] = []
    for i, label in enumerate(labels):
        start, end = bounds[i], bounds[i + 1]
        if end <= start:
            continue
        version = (dispatch if dispatch == label else UNKNOWN_VERSION) if i == 0 else label
        spans.append(VersionSpan(version=version or UNKNOWN_VERSION, start=start, end=end))
    merged = merge_spans(spans)
    return [] if all(s.version == UNKNOWN_VERSION for s in merged) else merged


def shifted(spans: Iterable[VersionSpan], offset: int) -> list[VersionSpan]:
    """The same spans ``offset`` tokens later (a call's generation placed in a trajectory)."""
    return [VersionSpan(version=s.version, start=s.start + offset, end=s.end + offset) for s in spans]


def versions_of(spans: Iterable[VersionSpan]) -> list[str]:
    """The distinct versions, in token order (unknown included as ``""``)."""
    return list(dict.fromkeys(s.version for s in spans))
