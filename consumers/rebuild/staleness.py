"""Policy staleness of a rebuilt rollout, and the ``max_staleness`` rule (pure).

A rollout's versions are the labels of every version span of every delivered
trajectory (``rollout.trajectory``; with ``delivery_mode="traces"``, every
trace's own trajectory instead), counting only spans that hold at least one
loss-bearing token (context the trainer does not train on cannot make a sample
off-policy). A span of unknown version (``""``: the interceptor bracketed an
update) counts as its call's ``dispatch_version``, the oldest its tokens can
be. A call with generated tokens but no spans at all counts as its
``policy_version`` labels (records written before per-token spans), else it has
no version.

Staleness is ``book.current.step - min(step of those labels)``, against the
book as it is when this is called (the consumer calls it right before
delivery). It is unknown (None, with why) when no version was ever announced,
when a label was never announced, or when a loss-bearing call names no version.

``apply_staleness`` always records ``policy_staleness``, ``oldest_policy_version``
and ``current_policy_version`` (and ``policy_staleness_unknown``, the why, when
unknown) in ``metrics.detail_json``, so ``_ng_token_capture`` shows them. With
``max_staleness`` set it masks, failing closed:

- staleness > K: ``stale_policy`` (reason names the staleness, K, the oldest and
  the current version, and the calls holding the oldest version); with
  ``action="drop"`` the rollout is not delivered at all (None is returned);
- staleness unknown on a rollout with loss-bearing tokens:
  ``unknown_policy_version`` (never dropped: the trainer sees why, never a guess).

A rollout without loss-bearing tokens has no staleness and is never masked for it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from schemas.policy_versions import UNKNOWN_VERSION, VersionBook
from schemas.records import CallSpan, MaskCode, MaskReason, RebuiltRollout, Trajectory

__all__ = ["STALE_ACTIONS", "StaleAction", "StalenessCheck", "apply_staleness", "check_staleness",
           "rollout_staleness", "unknown_version_reason"]

StaleAction = Literal["mask", "drop"]
STALE_ACTIONS: tuple[str, ...] = ("mask", "drop")

# Keys added to CaptureMetrics.detail_json (merged into _ng_token_capture by consumers.rebuild.output).
_STALENESS, _OLDEST, _CURRENT, _UNKNOWN = ("policy_staleness", "oldest_policy_version", "current_policy_version",
                                           "policy_staleness_unknown")


@dataclass(frozen=True, slots=True)
class StalenessCheck:
    """What the book says about one rollout's versions.

    ``staleness`` None: unknown (``why`` says why) or nothing to judge (``loss_bearing`` False).
    ``call_ids``: the calls holding the oldest version (known), else those naming no or an
    unannounced version.
    """

    staleness: int | None
    oldest: str | None
    current: str | None
    why: str = ""
    loss_bearing: bool = False
    call_ids: list[str] = field(default_factory=list)


def rollout_staleness(rollout: RebuiltRollout, book: VersionBook) -> tuple[int | None, str | None, str]:
    """``(staleness, oldest label, why)``; staleness and label None when unknown or nothing generated."""
    check = check_staleness(rollout, book)
    return check.staleness, check.oldest, check.why


def check_staleness(rollout: RebuiltRollout, book: VersionBook) -> StalenessCheck:
    """The rollout's staleness against ``book`` now (see the module docstring for the rule)."""
    current = book.current
    labels: dict[str, list[str]] = {}  # label -> call ids, in token order
    unnamed: list[str] = []  # loss-bearing calls that name no version
    for span in _loss_bearing_spans(rollout):
        call_labels = _labels(span)
        if not call_labels:
            unnamed.append(span.model_call_id)
        for label in call_labels:
            calls = labels.setdefault(label, [])
            if span.model_call_id not in calls:
                calls.append(span.model_call_id)
    cur = current.label if current is not None else None
    if not labels and not unnamed:
        return StalenessCheck(None, None, cur, why="no loss-bearing generated tokens")
    if unnamed:
        why = f"{len(set(unnamed))} call(s) name no policy version for (some of) their generated tokens"
        return StalenessCheck(None, None, cur, loss_bearing=True, call_ids=sorted(set(unnamed)), why=why)
    if current is None:
        ids = sorted({c for calls in labels.values() for c in calls})
        return StalenessCheck(None, None, None, loss_bearing=True, call_ids=ids,
                              why="no policy version was announced on the versions topic yet")
    unannounced = [label for label in labels if book.step_of(label) is None]
    if unannounced:
        ids = sorted({c for label in unannounced for c in labels[label]})
        return StalenessCheck(None, None, cur, loss_bearing=True, call_ids=ids,
                              why=f"version(s) {unannounced} were never announced on the versions topic")
    steps = {label: book.step_of(label) or 0 for label in labels}  # all announced (checked above)
    oldest = min(steps, key=steps.__getitem__)  # the first in token order on a tie
    staleness = max(0, current.step - steps[oldest])
    return StalenessCheck(staleness, oldest, current.label, loss_bearing=True, call_ids=sorted(labels[oldest]))


def apply_staleness(rollout: RebuiltRollout, book: VersionBook, max_staleness: int | None,
                    action: StaleAction = "mask", *, check: StalenessCheck | None = None) -> RebuiltRollout | None:
    """The rollout with its staleness in the metrics and, under ``max_staleness``, masked when stale.

    None: stale and ``action="drop"`` (the caller does not deliver it). ``check``: an already
    computed ``check_staleness(rollout, book)`` (not recomputed).
    """
    if action not in STALE_ACTIONS:
        raise ValueError(f"stale_action={action!r}: must be one of {list(STALE_ACTIONS)}")
    check = check if check is not None else check_staleness(rollout, book)
    reason = _reason(check, max_staleness) if max_staleness is not None else None
    if reason is not None and reason.code == MaskCode.STALE_POLICY and action == "drop":
        return None
    detail = json.loads(rollout.metrics.detail_json or "{}")
    detail.update({_STALENESS: check.staleness, _OLDEST: check.oldest, _CURRENT: check.current})
    if check.staleness is None and check.loss_bearing:
        detail[_UNKNOWN] = check.why
    metrics = dataclasses.replace(rollout.metrics,
                                  detail_json=json.dumps(detail, sort_keys=True, separators=(",", ":")))
    if reason is None:
        return dataclasses.replace(rollout, metrics=metrics)
    return dataclasses.replace(rollout, metrics=metrics, mask_sample=True,
                               mask_reasons=[*rollout.mask_reasons, reason])


def _reason(check: StalenessCheck, max_staleness: int) -> MaskReason | None:
    if check.staleness is None:
        if not check.loss_bearing:
            return None
        return MaskReason(code=MaskCode.UNKNOWN_POLICY_VERSION, call_ids=list(check.call_ids),
                          detail=f"max_staleness={max_staleness} cannot be checked: {check.why}")
    if check.staleness <= max_staleness:
        return None
    return MaskReason(code=MaskCode.STALE_POLICY, call_ids=list(check.call_ids), detail=(
        f"policy staleness {check.staleness} > max_staleness={max_staleness}: the oldest generated token is of "
        f"version {check.oldest!r}, the current version is {check.current!r}"))


def _trajectories(rollout: RebuiltRollout) -> Iterator[Trajectory]:
    # Traces mode: the traces hold every delivered token (the top-level trajectory is the main
    # trace's path again); otherwise the one delivered trajectory.
    if rollout.traces:
        yield from (t.trajectory for t in rollout.traces if t.trajectory is not None)
    elif rollout.trajectory is not None:
        yield rollout.trajectory


def unknown_version_reason(trajectories: Iterable[Trajectory]) -> MaskReason | None:
    """``unknown_policy_version`` when a loss-bearing token's version is not known (an ``""`` span), else None.

    Such a span was bracketed across an update (dispatched under one version, completed under
    another) or recorded while the interceptor's version lease had lapsed: which weights sampled
    those tokens is not known, and a trainer must not weigh them as either (issue 25: a token is
    labelled with its version, or its span is unknown and the rollout is masked; never a guess).
    """
    calls: dict[str, list[str]] = {}
    # Only a trajectory holding an unknown span can add to the reason: the others skip the loss-bearing
    # filter (a slice and scan of the mask per call, every rebuild, for a reason that is rare).
    suspects = [t for t in trajectories if any(v.version == UNKNOWN_VERSION for s in t.spans for v in s.version_spans)]
    for span in _loss_bearing_spans_of(suspects):
        unknown = [f"[{v.start}, {v.end})" for v in span.version_spans if v.version == UNKNOWN_VERSION]
        if unknown:
            calls.setdefault(span.model_call_id, []).extend(unknown)
    if not calls:
        return None
    where = "; ".join(f"{cid}: tokens {', '.join(spans)}" for cid, spans in calls.items())
    return MaskReason(code=MaskCode.UNKNOWN_POLICY_VERSION, call_ids=sorted(calls), detail=(
        f"the policy version of loss-bearing tokens is not known ({where[:400]}): the weights changed while they "
        "were generated and the interceptor could not tell where (a non-streamed call across an update, or its "
        "version lease lapsed); pause the engine with mode=wait or keep around updates, and keep the "
        "interceptors' access to the broker"))


def _loss_bearing_spans(rollout: RebuiltRollout) -> Iterator[CallSpan]:
    return _loss_bearing_spans_of(_trajectories(rollout))


def _loss_bearing_spans_of(trajectories: Iterable[Trajectory]) -> Iterator[CallSpan]:
    """Call spans with at least one loss-bearing generated token, each with only those version spans."""
    for traj in trajectories:
        cut = traj.spans[0].start if traj.spans else 0  # a trace's own part starts after its shared prefix
        mask = traj.loss_mask
        for span in traj.spans:
            if span.end <= span.generation_start or 1 not in mask[span.generation_start - cut:span.end - cut]:
                continue
            kept = [v for v in span.version_spans if 1 in mask[v.start - cut:v.end - cut]]
            yield dataclasses.replace(span, version_spans=kept) if kept != span.version_spans else span


def _labels(span: CallSpan) -> list[str]:
    """The version labels of one call's loss-bearing tokens (unknown spans as the dispatch version)."""
    if span.version_spans:
        labels = []
        for v in span.version_spans:
            label = v.version if v.version != UNKNOWN_VERSION else (span.dispatch_version or "")
            if not label:
                return []  # a token of unknown version and no dispatch version: the call names none
            labels.append(label)
        return list(dict.fromkeys(labels))
    return [label for label in (span.policy_version or "").split(",") if label]
