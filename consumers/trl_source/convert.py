"""A delivered record as OpenEnv ``TrainingTrace``-shaped turns (pure): what TRL trains on.

``convert_rollout(record)`` turns one ``RebuiltRollout`` into one turn per model call of every
loss-bearing trace, in trace order (``delivery_mode="traces"``: main, sub-agents, compaction
segments, forks; a record of another mode: its one terminal chain). For a call span
``(start, generation_start, end)`` of a trace expanded from its compact form
(``consumers.rebuild.tree.expand_trace``):

- ``node_id`` = the model call id (unique over the rollout: every call is one trace's own);
- ``prompt_token_ids`` = the trace's tokens ``[0, generation_start)``;
- ``completion_token_ids`` = ``[generation_start, end)``;
- ``per_token_logps`` = the engine's log-prob of every one of those tokens, loss-bearing or
  not: a trained call's from the trajectory's ``log_probs``, an untrained summary's
  (``train_summaries: false``) from the trace's projection (``generation_log_probs``), the
  only place the record keeps them;
- ``loss_mask`` = zeros over the prompt, then the trace's mask over the completion.

Guarantees: concatenating a trace's turns the way TRL's ``_chain_to_sequences`` does gives back
exactly the expanded trace's ids and loss mask, and its log-probs at every generated position;
nothing is trained that the record does not train on. It fails closed: a masked record
(``mask_sample``), a record without a numeric reward, or one whose content contradicts
itself (a mask on prompt tokens, a generation half trained, a positive or non-finite
log-prob, an empty prompt) is *unscorable* (no turns, reward None, the reasons listed),
never trained silently and never an exception that would stop TRL's rollout worker. Side
traces are left out (not the policy's), and so are masked traces of kinds that do not mask
the rollout (a broken sub-agent): listed in ``excluded`` with their reasons. An untrained
summary whose log-probs the record does not carry (the projection was not built, e.g.
``tokentrail consume --no-response``) is left out as a turn (its tokens stay context of any
later turn) and listed in ``notes``.

The policy version: the oldest version of any loss-bearing token of the rollout, by the steps of
``book`` (``consumers.rebuild.staleness.check_staleness``), else as the consumer recorded it at
delivery (``_ng_token_capture.oldest_policy_version``, step unknown).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from consumers.rebuild.staleness import check_staleness
from consumers.rebuild.tree import expand_trace
from schemas.errors import ContractError
from schemas.policy_versions import VersionBook
from schemas.records import CallSpan, RebuiltRollout, Trace, TraceKind, Trajectory

__all__ = ["ConversionError", "ConvertedRollout", "ConvertedTrace", "TurnData", "convert_rollout"]


class ConversionError(ContractError):
    """A record's content cannot become training turns (the rollout is then unscorable, with this reason)."""


@dataclass(frozen=True, slots=True)
class TurnData:
    """One model call in OpenEnv ``TrainingTurn`` shape (``loss_mask`` spans prompt + completion)."""

    node_id: str
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    per_token_logps: list[float]
    loss_mask: list[int]
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ConvertedTrace:
    """One loss-bearing trace, expanded: the whole sequence and its turns."""

    index: int  # in ``record.traces`` (-1: the top-level trajectory of a record without traces)
    kind: str
    label: str
    token_ids: list[int]
    loss_mask: list[int]
    log_probs: list[float]  # one per token: the engine's for every generated token, 0.0 on context
    turns: list[TurnData]


@dataclass(frozen=True, slots=True)
class ConvertedRollout:
    rollout_id: str
    snapshot_id: str
    version: int
    reward: float | None  # None: unscorable
    traces: list[ConvertedTrace]  # empty when unscorable
    unscorable: list[str] = field(default_factory=list)  # why (empty: scorable)
    excluded: list[str] = field(default_factory=list)  # traces left out, and why
    notes: list[str] = field(default_factory=list)
    policy_version: str | None = None  # the oldest loss-bearing version's label
    policy_step: int | None = None  # its step (None: no book, or never announced)
    terminal_trace: int | None = None  # position in ``traces`` of the trace holding the terminal call

    @property
    def scorable(self) -> bool:
        return not self.unscorable

    @property
    def turns(self) -> list[TurnData]:
        return [turn for trace in self.traces for turn in trace.turns]


def convert_rollout(record: RebuiltRollout, *, reward_key: str = "reward",
                    book: VersionBook | None = None) -> ConvertedRollout:
    """The record's turns, reward and oldest policy version (see the module docstring)."""
    version, step = _oldest_version(record, book)

    def out(reward: float | None, traces: list[ConvertedTrace], unscorable: list[str],
            terminal: int | None = None) -> ConvertedRollout:
        return ConvertedRollout(rollout_id=record.rollout_id, snapshot_id=record.snapshot_id,
                                version=record.version, reward=reward, traces=traces, unscorable=unscorable,
                                excluded=excluded, notes=notes, policy_version=version, policy_step=step,
                                terminal_trace=terminal)

    excluded: list[str] = []
    notes: list[str] = []
    if record.mask_sample:
        return out(None, [], [f"masked {r.code}: {r.detail}" for r in record.mask_reasons] or ["masked"])
    reward, problem = _reward(record.result_json, reward_key)
    if reward is None:
        return out(None, [], [problem])
    try:
        converted = _convert_traces(record, excluded, notes)
    except ContractError as exc:  # ConversionError, or expand_trace's: the record contradicts itself
        return out(None, [], [f"{type(exc).__name__}: {exc}"])
    return out(reward, converted, [], _terminal_position(record, converted))

def _convert_traces(record: RebuiltRollout, excluded: list[str], notes: list[str]) -> list[ConvertedTrace]:
    if not record.traces:
        if record.trajectory is None:
            raise ConversionError("the record has no trajectory and no traces: nothing to train on")
        return [_convert(-1, TraceKind.MAIN.value, "main", record.trajectory, record.trajectory,
                         record.response_json, notes)]
    out = []
    seen: set[str] = set()
    for index, trace in enumerate(record.traces):
        why = _left_out(trace)
        if why:
            excluded.append(f"trace {index} ({trace.kind} {trace.label}): {why}")
            continue
        assert trace.trajectory is not None  # _left_out checked it
        converted = _convert(index, trace.kind, trace.label, expand_trace(record, index), trace.trajectory,
                             trace.response_json, notes)
        for turn in converted.turns:
            if turn.node_id in seen:
                raise ConversionError(f"trace {index}: call {turn.node_id} is also another trace's own call")
            seen.add(turn.node_id)
        out.append(converted)
    return out


def _left_out(trace: Trace) -> str:
    if trace.kind == TraceKind.SIDE.value:
        return "a side trace (not the policy's tokens)"
    if trace.mask_sample:
        return "masked " + ", ".join(f"{r.code}" for r in trace.mask_reasons)
    if trace.trajectory is None:
        return "no trajectory"
    return ""


def _convert(index: int, kind: str, label: str, full: Trajectory, own: Trajectory, response_json: str | None,
             notes: list[str]) -> ConvertedTrace:
    """One trace: ``full`` the expanded trajectory, ``own`` the trace's own part (its spans, its log-probs)."""
    spans = full.spans[len(full.spans) - len(own.spans):]
    tokens, mask = full.token_ids, full.loss_mask
    log_probs = [0.0] * len(tokens)
    taken = 0
    projected: list[list[float]] | None = None
    turns: list[TurnData] = []
    for position, span in enumerate(spans):
        where = f"trace {index} ({kind} {label}), call {span.model_call_id}"
        if 1 in mask[span.start:span.generation_start]:
            raise ConversionError(f"{where}: loss mask 1 on prompt tokens [{span.start}, {span.generation_start})")
        if span.generation_start == 0:
            raise ConversionError(f"{where}: empty prompt; a training turn needs the engine's prompt ids")
        n = span.end - span.generation_start
        trained = mask.count(1, span.generation_start, span.end)
        if trained == n:
            values = own.log_probs[taken:taken + n]
            taken += n
        elif trained == 0 and n:
            projected = _projected_log_probs(response_json) if projected is None else projected
            values = projected[position] if position < len(projected) else []
            if len(values) != n:
                notes.append(f"{where}: an untrained generation whose log-probs the record does not carry "
                             "(no projection); left out as a turn, its tokens stay context")
                continue
        elif n:
            raise ConversionError(f"{where}: {trained} of its {n} generated tokens are loss-bearing; a call is "
                                  "trained whole or not at all")
        else:
            values = []
        _check_log_probs(where, values)
        log_probs[span.generation_start:span.end] = values
        turns.append(TurnData(
            node_id=span.model_call_id, prompt_token_ids=tokens[:span.generation_start],
            completion_token_ids=tokens[span.generation_start:span.end], per_token_logps=list(values),
            loss_mask=[0] * span.generation_start + list(mask[span.generation_start:span.end]),
            metadata=_metadata(index, kind, label, span)))
    if taken != len(own.log_probs):
        raise ConversionError(f"trace {index} ({kind} {label}): {len(own.log_probs)} log-probs for {taken} "
                              "loss-bearing generated tokens")
    return ConvertedTrace(index=index, kind=kind, label=label, token_ids=list(tokens), loss_mask=list(mask),
                          log_probs=log_probs, turns=turns)


def _projected_log_probs(response_json: str | None) -> list[list[float]]:
    """Each call's ``generation_log_probs`` from a projection, in call order (one carrier item per call)."""
    if not response_json:
        return []
    output = json.loads(response_json).get("output") or []
    return [list(item["generation_log_probs"]) for item in output
            if isinstance(item, dict) and "generation_log_probs" in item]


def _check_log_probs(where: str, values: list[float]) -> None:
    for i, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value > 0:
            raise ConversionError(f"{where}: per_token_logps[{i}] = {value!r} is not a finite log-prob <= 0")


def _metadata(index: int, kind: str, label: str, span: CallSpan) -> dict[str, Any]:
    """What a trainer may want beside the tokens: where the call sits and which weights sampled it."""
    return {
        "tokentrail_trace": index, "trace_kind": kind, "trace_label": label,
        "policy_version": span.policy_version, "dispatch_version": span.dispatch_version,
        # over the completion: [start, end) relative to generation_start
        "version_spans": [{"version": v.version, "start": v.start - span.generation_start,
                           "end": v.end - span.generation_start} for v in span.version_spans],
    }


def _reward(result_json: str, key: str) -> tuple[float | None, str]:
    try:
        result = json.loads(result_json)
    except ValueError:
        return None, "the finish result is not JSON"
    value = result.get(key) if isinstance(result, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None, (f"the finish result has no finite number under {key!r} (got {value!r}); "
                      f"finish the rollout with {{{key!r}: <float>}}")
    return float(value), ""


def _oldest_version(record: RebuiltRollout, book: VersionBook | None) -> tuple[str | None, int | None]:
    if book is not None:
        check = check_staleness(record, book)
        if check.oldest is not None:
            return check.oldest, book.step_of(check.oldest)
        return None, None
    try:
        detail = json.loads(record.metrics.detail_json or "{}")
    except ValueError:
        return None, None
    label = detail.get("oldest_policy_version") if isinstance(detail, dict) else None
    return (label if isinstance(label, str) else None), None


def _terminal_position(record: RebuiltRollout, traces: list[ConvertedTrace]) -> int | None:
    """Which converted trace holds the terminal call (the last call of the top-level trajectory)."""
    if record.trajectory is None or not record.trajectory.spans:
        return None
    last = record.trajectory.spans[-1].model_call_id
    for position, trace in enumerate(traces):
        if any(turn.node_id == last for turn in trace.turns):
            return position
    return None
