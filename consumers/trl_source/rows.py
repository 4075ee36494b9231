"""One ``trl.GRPOTrainer`` ``rollout_func`` row per rollout, from its converted turns (pure).

TRL 1.16's ``GRPOTrainer`` takes one row per generation: ``prompt_ids`` (the first prompt),
``completion_ids`` (everything after it, tool results and later prompts included), ``logprobs``
(one per completion token: the engine's for every generated token, 0.0 on context) and
``env_mask`` (1 = trained; TRL multiplies it into its completion mask). Only one conversation per
row fits, so the row is the trace that holds the terminal call (the conversation whose answer
the reward scores: the main trace, or the last compaction segment); the rollout's other
loss-bearing traces (sub-agents, forks, earlier segments) cannot be rows of their own here and
are named in ``tokentrail_dropped`` (TRL's ``HarnessRolloutWorker`` path trains them all).

An unscorable rollout (masked, no reward, a contradiction) still yields its row, because TRL
needs ``num_generations`` rows per prompt: its tokens with ``env_mask`` all 0 and
``tokentrail_reward`` None, so nothing of it is trained.
"""

from __future__ import annotations

from typing import Any

from consumers.trl_source.convert import ConvertedRollout
from schemas.records import RebuiltRollout

__all__ = ["ROW_KEYS", "grpo_row"]

ROW_KEYS = ("prompt_ids", "completion_ids", "logprobs", "env_mask", "tokentrail_reward", "tokentrail_rollout_id",
            "policy_version", "policy_step", "tokentrail_unscorable", "tokentrail_dropped")


def grpo_row(record: RebuiltRollout | None, converted: ConvertedRollout, *, fallback_token_id: int) -> dict[str, Any]:
    """The row of one rollout (keys ``ROW_KEYS``); ``fallback_token_id`` (e.g. EOS) is the lone
    completion token of an unscorable rollout that has no trajectory (or no record) at all (TRL needs one)."""
    extra = {"tokentrail_reward": converted.reward, "tokentrail_rollout_id": converted.rollout_id,
             "policy_version": converted.policy_version, "policy_step": converted.policy_step,
             "tokentrail_unscorable": list(converted.unscorable), "tokentrail_dropped": []}
    if converted.scorable and converted.terminal_trace is not None:
        trace = converted.traces[converted.terminal_trace]
        cut = len(trace.turns[0].prompt_token_ids)
        extra["tokentrail_dropped"] = [f"trace {t.index} ({t.kind} {t.label})" for t in converted.traces
                                       if t is not trace and 1 in t.loss_mask]
        return {"prompt_ids": trace.token_ids[:cut], "completion_ids": trace.token_ids[cut:],
                "logprobs": trace.log_probs[cut:], "env_mask": trace.loss_mask[cut:], **extra}
    if converted.scorable:  # no trace holds the terminal call: nothing fits one row, so nothing is trained
        extra["tokentrail_reward"] = None
        extra["tokentrail_unscorable"] = ["no converted trace holds the terminal call"]
    traj = record.trajectory if record is not None else None
    if traj is None or not traj.spans or traj.spans[0].generation_start >= len(traj.token_ids):
        return {"prompt_ids": [], "completion_ids": [fallback_token_id], "logprobs": [0.0], "env_mask": [0],
                **extra}
    cut = traj.spans[0].generation_start
    rest = len(traj.token_ids) - cut
    return {"prompt_ids": traj.token_ids[:cut], "completion_ids": traj.token_ids[cut:], "logprobs": [0.0] * rest,
            "env_mask": [0] * rest, **extra}
