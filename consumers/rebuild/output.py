"""The JSON form of a rebuilt rollout (one object per rollout; what the JSONL sink writes).

``{rollout_id, snapshot_id, version, mask_sample, mask_reasons, trajectory,
response, result, _ng_token_capture}``. ``mask_sample`` is always present (a
trainer never has to infer health from a missing key). ``_ng_token_capture``
holds the metrics and, merged in, the lists of ``detail_json``.

Both renderers pass the record through ``validity.checked_record`` first, so
the output is always strict JSON (no NaN, no Infinity) and a record whose
result, projection or metrics cannot be rendered comes out masked with the
reason, never as an exception: a record's content cannot stop a sink.
"""

from __future__ import annotations

import json
from typing import Any

from consumers.rebuild.validity import checked_record
from schemas.records import RebuiltRollout

_RESPONSE_SLOT = '"response":null'


def to_json_dict(rollout: RebuiltRollout, *, include_response: bool = True) -> dict[str, Any]:
    """The record as a JSON-ready dict (parses the projection; see ``to_json_line`` for the fast path)."""
    rollout = checked_record(rollout)
    out = _skeleton(rollout)
    if include_response and rollout.response_json:
        out["response"] = json.loads(rollout.response_json)
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
    # A lone surrogate (only a record built in Python can hold one) has no UTF-8 form: it is written as
    # its \\uXXXX escape, which reads back as the same character (here a backslash only starts escapes).
    return text.encode("utf-8", "backslashreplace") + b"\n"


def _skeleton(rollout: RebuiltRollout) -> dict[str, Any]:
    m = rollout.metrics
    traj = rollout.trajectory
    return {
        "rollout_id": rollout.rollout_id,
        "snapshot_id": rollout.snapshot_id,
        "version": rollout.version,
        "mask_sample": rollout.mask_sample,
        "mask_reasons": [{"code": r.code, "detail": r.detail, "call_ids": r.call_ids} for r in rollout.mask_reasons],
        "trajectory": None
        if traj is None
        else {
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
                }
                for s in traj.spans
            ],
        },
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
