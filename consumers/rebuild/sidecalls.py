"""Side-call classification over captured facts (pure).

A side call is model traffic of the harness that is not the policy's rollout:
a conversation title, a quota probe, a background summary or sub-agent sent to
a small model. Capture records facts only (requested model, tools offered,
lineage); the decision is made here, at rebuild time, so replay can re-decide
under new rules. Rules, first match wins:

1. ``pattern``: the requested model contains one of ``rules.side_call_models``
   (case-insensitive);
2. ``policy_model``: ``rules.policy_model`` is set and the call requested another
   (non-empty) model;
3. ``self_calibration``: with no policy model configured, among the remaining
   calls that name a requested model, if more than one model appears the one
   with the most generated tokens (ties: the smaller name) is the policy model
   and calls requesting another are side calls;
4. ``toolless_short``: a ROOT call (no model-authored history) that offered no
   tools, is continued by no captured call, and generated at most
   ``rules.toolless_max_tokens`` tokens, in a rollout where some other call
   offered tools.

Calls that name no requested model are never excluded by rules 2-3 (nothing to
compare). Guarantee: classification depends on the set of calls, not on their
order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from consumers.rebuild.rules import RebuildRules
from schemas.records import CallCaptured, ParentResolution


@dataclass(frozen=True, slots=True)
class SideCall:
    call_id: str
    rule: str
    requested_model: str


def classify_side_calls(calls: list[CallCaptured], rules: RebuildRules) -> dict[str, SideCall]:
    """Call id -> why it is a side call, for every side call among ``calls`` (deduplicated by id)."""
    side: dict[str, SideCall] = {}

    def mark(call: CallCaptured, rule: str) -> None:
        if call.facts.trace_declared and rule != "declared":
            return  # declared by the harness: no inference overrides it
        side.setdefault(call.model_call_id, SideCall(call.model_call_id, rule, call.facts.requested_model))

    for call in calls:
        declared = call.facts.trace_declared
        if declared and declared.partition(":")[0] == "side":  # most calls declare nothing: no partition
            mark(call, "declared")
    if rules.side_call_models:
        for call in calls:
            model = call.facts.requested_model.lower()
            if model and any(p in model for p in rules.side_call_models):
                mark(call, "pattern")
    remaining = [c for c in calls if c.model_call_id not in side]
    policy = rules.policy_model
    rule = "policy_model"
    if policy is None and rules.self_calibrate:
        policy, rule = _calibrated_policy_model(remaining), "self_calibration"
    if policy is not None:
        for call in remaining:
            if call.facts.requested_model and call.facts.requested_model != policy:
                mark(call, rule)
    if rules.toolless_max_tokens > 0:
        _toolless_short(calls, side, rules.toolless_max_tokens, mark)
    return side


def _calibrated_policy_model(calls: list[CallCaptured]) -> str | None:
    mass: Counter[str] = Counter()
    for call in calls:
        if call.facts.requested_model:
            mass[call.facts.requested_model] += len(call.generation_token_ids)
    if len(mass) < 2:
        return None  # one model (or none): nothing to calibrate against
    return min(mass, key=lambda model: (-mass[model], model))


def _toolless_short(calls: list[CallCaptured], side: dict[str, SideCall], limit: int,
                    mark: Callable[[CallCaptured, str], None]) -> None:
    if not any(c.facts.tools_present for c in calls if c.model_call_id not in side):
        return  # a tool-less rollout: short tool-less calls are its turns, not side calls
    continued = {c.parent_call_id for c in calls if c.parent_call_id}
    for call in calls:
        if (
            call.parent_resolution is ParentResolution.ROOT  # first: all but a rollout's first call fail it
            and call.model_call_id not in side
            and not call.facts.tools_present
            and call.model_call_id not in continued
            and len(call.generation_token_ids) <= limit
        ):
            mark(call, "toolless_short")
