"""Every delivered record renders as strict JSON; what cannot is masked, never guessed (pure).

A rebuilt record carries text that came from outside the rebuild: the rollout
result (``RolloutFinished.result_json``, opaque JSON from whoever finished the
rollout: the finish API, a Gym adapter, a direct event, a buggy finisher), the
captured output items and routed experts (inside the projection), and
log-probs. Python's ``json`` reads and writes ``NaN`` / ``Infinity`` (and reads
``1e999`` as infinity) by default, which is not JSON, and a result that is not
JSON at all would stop any sink that parses it, on every restart.

``checked_record(rollout)`` returns the record unchanged when every part of it
is valid, and otherwise a copy that is masked with a reason per problem:

- ``invalid_result``: the result is not JSON, or holds a non-finite number (a
  ``NaN`` reward is no reward). The raw text is kept, as a JSON string, in
  ``result``: nothing a producer sent is dropped, and nothing is guessed.
- ``non_finite_log_prob``: a delivered log-prob is NaN or infinite; the
  trajectory and the projection (which repeats the log-probs) are withheld.
- ``non_finite_value``: the projection or a metric holds a non-finite number
  (the projection is withheld; a metric is reported as 0.0).
- ``invalid_record``: the projection is not a JSON object (withheld), or the
  metrics' detail is not one (kept as a string);
- the same per trace (``delivery_mode="traces"``): the trace withholds the part
  and is masked, and the rollout carries the reason too.

``rebuild`` applies it to everything it returns (``built=True``: what it wrote
itself, its trajectories and projections, is strict by construction and not
scanned twice), and every built-in sink applies it again, in full, before
writing (a no-op for a record that came from ``rebuild``), so no record's
content can make a sink write non-JSON or raise.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from schemas.errors import TokentrailError
from schemas.records import CaptureMetrics, MaskCode, MaskReason, RebuiltRollout, Trace, Trajectory

_QUOTE = 120  # characters of an offending text quoted in a mask reason
_METRIC_FLOATS = ("delivered_fraction", "quarantined_fraction")


class InvalidJson(TokentrailError, ValueError):
    """Text that is not strict JSON (RFC 8259: no NaN, no Infinity, no number that overflows a double)."""


class NonFiniteJson(InvalidJson):
    """JSON-like text holding NaN, Infinity or a number that overflows a double."""


def _constant(name: str) -> Any:
    raise NonFiniteJson(f"non-finite number {name} (JSON has no NaN or Infinity)")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise NonFiniteJson(f"number {text} overflows a double (it would be written as {value})")
    return value


def strict_loads(text: str) -> Any:
    """``json.loads`` that refuses NaN, Infinity and overflowing numbers, raising ``InvalidJson`` with the reason."""
    if not isinstance(text, str):
        raise InvalidJson(f"expected JSON text, got {type(text).__name__}")
    try:
        return json.loads(text, parse_constant=_constant, parse_float=_float)
    except InvalidJson:
        raise
    except (ValueError, RecursionError) as exc:  # JSONDecodeError names the line and column
        raise InvalidJson(str(exc) or type(exc).__name__) from None


def quote(text: str) -> str:
    """A short, printable quotation of ``text`` for a mask reason."""
    shown = text if len(text) <= _QUOTE else text[:_QUOTE] + "..."
    return json.dumps(shown, ensure_ascii=True) + (f" ({len(text)} characters)" if len(text) > _QUOTE else "")


def first_non_finite(values: list[float]) -> tuple[int, float] | None:
    """Index and value of the first NaN or infinite number (a finite sum proves there is none)."""
    try:
        if math.isfinite(sum(values)):
            return None
    except TypeError:
        pass
    for index, value in enumerate(values):
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            return index, value
    return None  # only the sum overflowed


def result_problem(result_json: Any) -> str | None:
    """Why the rollout result is not strict JSON, or None (a lone surrogate, raw or escaped, is no text)."""
    try:
        value = strict_loads(result_json)
    except InvalidJson as exc:
        return str(exc)
    if not result_json.isascii() or "\\u" in result_json:  # only then can it hold a lone surrogate
        try:
            result_json.encode("utf-8")
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            return (f"it holds a lone surrogate ({exc.object[exc.start:exc.end]!r}), which is not Unicode text and "
                    "cannot be written as UTF-8")
    return None


def checked_record(rollout: RebuiltRollout, *, built: bool = False) -> RebuiltRollout:
    """The record, or a masked copy of it whose every part renders as strict JSON (see the module docstring).

    ``built=True`` is ``rebuild``'s own call on the record it just made: its trajectories'
    log-probs were checked finite call by call (``chain_trajectory``) and its projections
    were written by ``project_response_json``, strict by construction (every number through
    an ``allow_nan=False`` encoder, every captured JSON text through ``strict_loads``), so
    those checks are not repeated (the projection's is a scan of calls x tokens of text).
    The result and the metrics are checked either way, and a sink checks everything again.
    """
    reasons: list[MaskReason] = []
    changes: dict[str, Any] = {}

    result = rollout.result_json
    why = result_problem(result)
    if why is not None:
        raw = result if isinstance(result, str) else repr(result)
        reasons.append(MaskReason(
            code=MaskCode.INVALID_RESULT,
            detail=(f"result_json (the RolloutFinished result) is not valid JSON: {why}; value {quote(raw)}. "
                    "It is kept as a JSON string in `result`. Fix the finisher: send the result as a JSON value "
                    "with finite numbers only (producers.finish.finish_rollout / `tokentrail finish --result`)."),
        ))
        # A lone surrogate is kept as its escape text (\\udc80), so the string is UTF-8 and a second check passes it.
        changes["result_json"] = json.dumps(raw.encode("utf-8", "backslashreplace").decode("utf-8"), ensure_ascii=False)

    trajectory = rollout.trajectory
    if trajectory is not None and not built:
        bad = first_non_finite(trajectory.log_probs)
        if bad is not None:
            index, value = bad
            call = _call_of_log_prob(trajectory, index)
            reasons.append(MaskReason(
                code=MaskCode.NON_FINITE_LOG_PROB,
                detail=(f"trajectory log_probs[{index}] = {value!r} (call {call}) is not a finite number; the "
                        "trajectory and the projection are withheld. Fix the capture: every generated token needs "
                        "the finite log-prob the engine sampled it with."),
                call_ids=[call] if call else [],
            ))
            changes["trajectory"] = None
            changes["response_json"] = None

    response = changes.get("response_json", rollout.response_json)
    if response is not None and not built:
        problem = _response_problem(response)
        if problem is not None:
            code, why = problem
            reasons.append(MaskReason(
                code=code,
                detail=f"response_json (the Responses projection) is not valid JSON: {why}; the projection is "
                       "withheld. Fix the capture of the calls' output items (strict JSON, finite numbers only).",
            ))
            changes["response_json"] = None

    traces, trace_reasons = _checked_traces(rollout.traces) if not built else (rollout.traces, [])
    if trace_reasons:
        reasons += trace_reasons
        changes["traces"] = traces

    metrics, metric_reasons = _checked_metrics(rollout.metrics)
    if metric_reasons:
        reasons += metric_reasons
        changes["metrics"] = metrics

    if not reasons:
        return rollout
    return dataclasses.replace(rollout, mask_sample=True, mask_reasons=[*rollout.mask_reasons, *reasons], **changes)


def _checked_traces(traces: list[Trace]) -> tuple[list[Trace], list[MaskReason]]:
    """Each trace withholds what cannot render (its trajectory, its projection) and is masked with the
    reason; the rollout is masked too, naming the trace: a record with a corrupt part is not trusted whole."""
    out: list[Trace] = []
    rollout_reasons: list[MaskReason] = []
    for index, trace in enumerate(traces):
        found: list[MaskReason] = []
        changes: dict[str, Any] = {}
        if trace.trajectory is not None and (bad := first_non_finite(trace.trajectory.log_probs)) is not None:
            found.append(MaskReason(code=MaskCode.NON_FINITE_LOG_PROB, call_ids=list(trace.call_ids),
                                    detail=f"trace {index} log_probs[{bad[0]}] = {bad[1]!r} is not a finite number; "
                                           "its trajectory and projection are withheld"))
            changes["trajectory"], changes["response_json"] = None, None
        response = changes.get("response_json", trace.response_json)
        if response is not None and (problem := _response_problem(response)) is not None:
            found.append(MaskReason(code=problem[0], call_ids=list(trace.call_ids),
                                    detail=f"trace {index} response_json is not valid JSON: {problem[1]}; withheld"))
            changes["response_json"] = None
        if found:
            trace = dataclasses.replace(trace, mask_sample=True, mask_reasons=[*trace.mask_reasons, *found], **changes)
            rollout_reasons += found
        out.append(trace)
    return out, rollout_reasons


def _response_problem(response: Any) -> tuple[MaskCode, str] | None:
    if not isinstance(response, str):
        return MaskCode.INVALID_RECORD, f"expected JSON text, got {type(response).__name__}"
    stripped = response.strip()
    if not (stripped.startswith("{") and stripped.endswith("}")):
        return MaskCode.INVALID_RECORD, f"not a JSON object: {quote(response)}"
    # NaN and Infinity can only be written as those words: only a projection that holds one of them
    # somewhere (a string may, legitimately) is parsed; the projection is calls x tokens.
    if _holds_word(response, "NaN") or _holds_word(response, "Infinity"):
        try:
            strict_loads(response)
        except NonFiniteJson as exc:
            return MaskCode.NON_FINITE_VALUE, str(exc)
        except InvalidJson as exc:
            return MaskCode.INVALID_RECORD, str(exc)
    return None


def _holds_word(text: str, word: str) -> bool:
    """``word in text``, by a memchr scan for its first letter (the scan every delivered record pays).

    A projection is mostly digits and commas (tens of MB for a long rollout), where a one-character
    search runs at memory speed and a multi-character one several times slower; the letter is rare
    there, so the per-hit check in Python runs only over the text of output items.
    """
    first, i = word[0], text.find(word[0])
    while i != -1:
        if text.startswith(word, i):
            return True
        i = text.find(first, i + 1)
    return False


def _checked_metrics(m: CaptureMetrics) -> tuple[CaptureMetrics, list[MaskReason]]:
    reasons: list[MaskReason] = []
    changes: dict[str, Any] = {}
    for name in _METRIC_FLOATS:
        value = getattr(m, name)
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            reasons.append(MaskReason(code=MaskCode.NON_FINITE_VALUE,
                                      detail=f"metric {name} = {value!r} is not a finite number; reported as 0.0"))
            changes[name] = 0.0
    try:
        detail = strict_loads(m.detail_json)
        problem = None if isinstance(detail, dict) else f"a JSON {type(detail).__name__}, not an object"
    except InvalidJson as exc:
        problem = str(exc)
    if problem is not None:
        raw = m.detail_json if isinstance(m.detail_json, str) else repr(m.detail_json)
        reasons.append(MaskReason(code=MaskCode.INVALID_RECORD,
                                  detail=f"metrics detail_json is not a JSON object ({problem}); value {quote(raw)}; "
                                         "kept as a string under invalid_detail_json"))
        changes["detail_json"] = json.dumps({"invalid_detail_json": raw}, ensure_ascii=False)
    return (dataclasses.replace(m, **changes) if changes else m), reasons


def _call_of_log_prob(trajectory: Trajectory, index: int) -> str | None:
    """The call whose generated tokens hold the ``index``-th log-prob."""
    seen = 0
    for span in trajectory.spans:
        generated = span.end - span.generation_start
        if index < seen + generated:
            return span.model_call_id
        seen += generated
    return None
