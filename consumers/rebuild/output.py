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

``to_json_line`` writes the same bytes as serialising ``to_json_dict``'s shape
would, from fragments: the small parts through the encoder, the trajectory's
arrays through ``jsontext`` (the loss mask without a Python int per token), the
projection spliced in as the text it already is; the fragments are joined once
and encoded once (two copies of a projection of calls x tokens, not four).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from consumers.rebuild.jsontext import bit_list, dumps
from consumers.rebuild.validity import checked_record
from schemas.records import CaptureMetrics, MaskReason, RebuiltRollout, Trace, Trajectory


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
    response = rollout.response_json if include_response and rollout.response_json else "null"
    parts = [dumps(_head(rollout))[:-1], ',"trajectory":', *_trajectory_text(rollout.trajectory),
             ',"response":', response, ',"result":', dumps(json.loads(rollout.result_json)),
             ',"_ng_token_capture":', dumps(_capture(rollout.metrics))]
    if rollout.traces:
        parts.append(',"traces":[')
        for index, trace in enumerate(rollout.traces):
            parts += _trace_text(trace, include_response, first=index == 0)
        parts.append("]")
    parts.append("}\n")
    # A lone surrogate (only a record built in Python can hold one) has no UTF-8 form: it is written as
    # its \\uXXXX escape, which reads back as the same character (here a backslash only starts escapes).
    return "".join(parts).encode("utf-8", "backslashreplace")


def _trace_text(trace: Trace, include_response: bool, first: bool) -> list[str]:
    """``dumps(_trace_skeleton(trace))`` as fragments, the projection spliced in (after a comma unless first)."""
    head = dumps(_trace_head(trace))
    response = trace.response_json if include_response and trace.response_json else "null"
    return [("" if first else ",") + head[:-1], ',"trajectory":', *_trajectory_text(trace.trajectory),
            ',"response":', response, ',"_ng_token_capture":', dumps(_trace_capture(trace)), "}"]


def _trace_skeleton(trace: Trace) -> dict[str, Any]:
    return {**_trace_head(trace), "trajectory": _trajectory(trace.trajectory), "response": None,
            "_ng_token_capture": _trace_capture(trace)}


def _trace_head(trace: Trace) -> dict[str, Any]:
    """A trace's keys before ``trajectory``."""
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
    }


def _trace_capture(trace: Trace) -> dict[str, Any]:
    traj = trace.trajectory
    own_prompt = (len(traj.loss_mask) - traj.loss_mask.count(1)) if traj is not None else 0
    return {"calls": len(trace.call_ids), "loss_tokens": trace.loss_tokens,
            "context_tokens": trace.prefix_len + own_prompt}


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
        "spans": _spans(traj),
    }


def _trajectory_text(traj: Trajectory | None) -> list[str]:
    """``dumps(_trajectory(traj))`` as fragments: each per-token array formatted once, in C."""
    if traj is None:
        return ["null"]
    return ['{"token_ids":', dumps(traj.token_ids), ',"loss_mask":', bit_list(traj.loss_mask),
            ',"log_probs":', dumps(traj.log_probs), ',"prompt_len":', dumps(traj.prompt_len),
            ',"spans":', dumps(_spans(traj)), "}"]


def _spans(traj: Trajectory) -> list[dict[str, Any]]:
    return [
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
    ]


def _head(rollout: RebuiltRollout) -> dict[str, Any]:
    """The record's keys before ``trajectory``."""
    return {
        "rollout_id": rollout.rollout_id,
        "snapshot_id": rollout.snapshot_id,
        "version": rollout.version,
        "mask_sample": rollout.mask_sample,
        "mask_reasons": _reasons(rollout.mask_reasons),
    }


def _skeleton(rollout: RebuiltRollout) -> dict[str, Any]:
    return {
        **_head(rollout),
        "trajectory": _trajectory(rollout.trajectory),
        "response": None,
        "result": json.loads(rollout.result_json),
        "_ng_token_capture": _capture(rollout.metrics),
    }


def _capture(m: CaptureMetrics) -> dict[str, Any]:
    """``_ng_token_capture``: the metrics, and the lists of ``detail_json`` merged in."""
    return {
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
    }
