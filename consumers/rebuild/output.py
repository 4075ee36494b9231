"""The JSON form of a rebuilt rollout (one object per rollout; what the JSONL sink writes).

``{rollout_id, snapshot_id, version, mask_sample, mask_reasons, trajectory,
response, result, _ng_token_capture}``, and ``traces`` when the rollout was
rebuilt with ``delivery_mode="traces"``. ``mask_sample`` is always present (a
trainer never has to infer health from a missing key). ``_ng_token_capture``
holds the metrics and, merged in, the lists of ``detail_json``. Each trace is
in compact tree form (its own tokens after ``prefix_len`` tokens of
``traces[prefix_trace]``; ``consumers.rebuild.tree.expand_trace`` joins them)
with its own ``mask_sample``, reasons, projection and ``_ng_token_capture``
(``calls``, ``loss_tokens``, ``context_tokens``).

Both renderers pass the record through ``validity.checked_record`` first, so
the output is always strict JSON (no NaN, no Infinity) and a record whose
result, projection or metrics cannot be rendered comes out masked with the
reason, never as an exception: a record's content cannot stop a sink.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from consumers.rebuild.validity import checked_record
from schemas.records import MaskReason, RebuiltRollout, Trace, Trajectory

_RESPONSE_SLOT = '"response":null'


def to_json_dict(rollout: RebuiltRollout, *, include_response: bool = True) -> dict[str, Any]:
    """The record as a JSON-ready dict (parses the projection; see ``to_json_line`` for the fast path)."""
    rollout = checked_record(rollout)
    out = _skeleton(rollout)
    if include_response and rollout.response_json:
        out["response"] = json.loads(rollout.response_json)
    if rollout.traces:
        out["traces"] = [_trace_skeleton(t) for t in rollout.traces]
        if include_response:
            for rendered, trace in zip(out["traces"], rollout.traces):
                rendered["response"] = json.loads(trace.response_json) if trace.response_json else None
    return out


def to_json_line(rollout: RebuiltRollout, *, include_response: bool = True) -> bytes:
    """The record as one compact JSON line (with the trailing newline), byte-deterministic.

    The projection is spliced in as the text it already is, never parsed and
    re-serialised (it is calls x tokens).
    """
    rollout = checked_record(rollout)
    text = json.dumps(_skeleton(rollout), separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    if include_response and rollout.response_json:
        # The first occurrence is the key itself: no earlier value can contain an unescaped quote.
        text = text.replace(_RESPONSE_SLOT, '"response":' + rollout.response_json, 1)
    if rollout.traces:
        traces = ",".join(_trace_text(t, include_response) for t in rollout.traces)
        text = text[:-1] + ',"traces":[' + traces + "]}"
    # A lone surrogate (only a record built in Python can hold one) has no UTF-8 form: it is written as
    # its \\uXXXX escape, which reads back as the same character (here a backslash only starts escapes).
    return text.encode("utf-8", "backslashreplace") + b"\n"


def _trace_text(trace: Trace, include_response: bool) -> str:
    text = json.dumps(_trace_skeleton(trace), separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    if include_response and trace.response_json:
        text = text.replace(_RESPONSE_SLOT, '"response":' + trace.response_json, 1)  # as above: the key itself
    return text


def _trace_skeleton(trace: Trace) -> dict[str, Any]:
    traj = trace.trajectory
    own_prompt = (len(traj.loss_mask) - traj.loss_mask.count(1)) if traj is not None else 0
    return {
        "kind": trace.kind,
        "label": trace.label,
        "segment": trace.segment,
        "parent_trace": trace.parent_trace,
        "attachment": None if trace.attachment is None else {
            "call_id": trace.attachment.call_id, "tool_call_id": trace.attachment.tool_call_id},
        "classified_by": trace.classified_by,
        "prefix_trace": trace.prefix_trace,
        "prefix_len": trace.prefix_len,
        "mask_sample": trace.mask_sample,
        "mask_reasons": _reasons(trace.mask_reasons),
        "call_ids": trace.call_ids,
        "trajectory": _trajectory(traj),
        "response": None,
        "_ng_token_capture": {"calls": len(trace.call_ids), "loss_tokens": trace.loss_tokens,
                              "context_tokens": trace.prefix_len + own_prompt},
    }


def _reasons(reasons: Iterable[MaskReason]) -> list[dict[str, Any]]:
    return [{"code": r.code, "detail": r.detail, "call_ids": r.call_ids} for r in reasons]


def _trajectory(traj: Trajectory | None) -> dict[str, Any] | None:
    if traj is None:
        return None
    return {
        "token_ids": traj.token_ids,
        "loss_mask": list(traj.loss_mask),
        "log_probs": traj.log_probs,
        "prompt_len": traj.prompt_len,
        "spans": [
            {
                "model_call_id": s.model_call_id,
                "start": s.start,
                "generation_start": s.generation_start,
                "end": s.end,
                "policy_version": s.policy_version,
                "version_spans": [{"version": v.version, "start": v.start, "end": v.end} for v in s.version_spans],
                "version_source": s.version_source,
                "dispatch_version": s.dispatch_version,
            }
            for s in traj.spans
        ],
    }


def _skeleton(rollout: RebuiltRollout) -> dict[str, Any]:
    m = rollout.metrics
    return {
        "rollout_id": rollout.rollout_id,
        "snapshot_id": rollout.snapshot_id,
        "version": rollout.version,
        "mask_sample": rollout.mask_sample,
        "mask_reasons": _reasons(rollout.mask_reasons),
        "trajectory": _trajectory(rollout.trajectory),
        "response": None,
        "result": json.loads(rollout.result_json),
        "_ng_token_capture": {
            "n_calls": m.n_calls,
            "roots": m.roots,
            "chains": m.chains,
            "delivered_fraction": m.delivered_fraction,
            "quarantined_calls": m.quarantined_calls,
            "quarantined_fraction": m.quarantined_fraction,
            "empty_generation_calls": m.empty_generation_calls,
            "unresolved_parent_calls": m.unresolved_parent_calls,
            "parent_link_failures": m.parent_link_failures,
            "generated_tokens_captured": m.generated_tokens_captured,
            "generated_tokens_delivered": m.generated_tokens_delivered,
            "capture_incomplete": m.capture_incomplete,
            "side_calls_excluded": m.side_calls_excluded,
            "terminal_attribution": {
                "chain": m.terminal_attribution.chain,
                "method": m.terminal_attribution.method,
                "call_id": m.terminal_attribution.call_id,
            },
            "error": m.error,
            **json.loads(m.detail_json),
        },
    }
