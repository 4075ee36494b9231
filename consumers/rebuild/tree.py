"""Reading a rollout's traces (pure): whole trajectories from the compact tree form, the trace tree.

``RebuiltRollout.traces`` stores each trace's own tokens once, after
``prefix_len`` tokens of ``traces[prefix_trace]``. ``expand_trace`` joins
them back into one contiguous trajectory, the shared prefix loss-masked (it is
context, trained on in the trace that owns it); ``tree_sizes`` measures the
compact form against the expanded one; ``children`` gives the identity tree
(``parent_trace``) a trainer walks to rebuild the sub-agent tree, or ignores.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.errors import ContractError
from schemas.records import CallSpan, RebuiltRollout, Trace, Trajectory

__all__ = ["TreeSizes", "children", "expand_trace", "tree_sizes"]


def expand_trace(rollout: RebuiltRollout, index: int) -> Trajectory:
    """Trace ``index`` as one contiguous trajectory; only its own tokens are loss-bearing.

    Raises ``ContractError`` for a trace without a trajectory, a prefix chain that
    does not go back to earlier traces, or a prefix longer than its source.
    """
    chain = _prefix_chain(rollout.traces, index)
    token_ids: list[int] = []
    spans: list[CallSpan] = []
    cut = rollout.traces[index].prefix_len
    for position in reversed(chain):  # oldest first: each trace continues where its prefix ends
        trace = rollout.traces[position]
        own = _trajectory(trace, position)
        if trace.prefix_len != len(token_ids):
            token_ids = token_ids[:trace.prefix_len]
            spans = [s for s in spans if s.end <= trace.prefix_len]
        if len(token_ids) != trace.prefix_len:
            raise ContractError(f"trace {position}: prefix_len={trace.prefix_len} but trace {trace.prefix_trace} "
                                f"has only {len(token_ids)} tokens")
        token_ids += own.token_ids
        spans += own.spans
    own = _trajectory(rollout.traces[index], index)
    mask = bytes(cut) + own.loss_mask
    return Trajectory(token_ids=token_ids, loss_mask=mask, log_probs=list(own.log_probs),
                      prompt_len=own.prompt_len, spans=spans)


def children(rollout: RebuiltRollout) -> dict[int, list[int]]:
    """``parent_trace -> [child trace indices]`` (-1 holds the top traces), in trace order."""
    out: dict[int, list[int]] = {}
    for index, trace in enumerate(rollout.traces):
        out.setdefault(trace.parent_trace, []).append(index)
    return out


@dataclass(frozen=True, slots=True)
class TreeSizes:
    stored_tokens: int  # token ids the compact form stores (each trace's own part)
    expanded_tokens: int  # token ids of every trace written out whole


def tree_sizes(rollout: RebuiltRollout) -> TreeSizes:
    """How much the compact tree form saves over writing every trace out whole."""
    stored = sum(len(t.trajectory.token_ids) for t in rollout.traces if t.trajectory is not None)
    expanded = sum(t.prefix_len + len(t.trajectory.token_ids) for t in rollout.traces if t.trajectory is not None)
    return TreeSizes(stored_tokens=stored, expanded_tokens=expanded)


def _prefix_chain(traces: list[Trace], index: int) -> list[int]:
    if not 0 <= index < len(traces):
        raise ContractError(f"trace index {index} out of range: the rollout has {len(traces)} traces")
    chain = [index]
    while (parent := traces[chain[-1]].prefix_trace) != -1:
        if not 0 <= parent < chain[-1]:
            raise ContractError(f"trace {chain[-1]}: prefix_trace={parent} must name an earlier trace")
        chain.append(parent)
    return chain


def _trajectory(trace: Trace, index: int) -> Trajectory:
    if trace.trajectory is None:
        raise ContractError(f"trace {index} ({trace.kind} {trace.label}) has no trajectory: "
                            f"{', '.join(r.code for r in trace.mask_reasons) or 'none delivered'}")
    return trace.trajectory
