"""What ``tokentrail demo-trl`` checks and prints: TRL's batch rows against the delivered records (pure).

``row_mismatches(row, record)`` compares one row as TRL held it for the loss (the trainer child's
``batch`` event) with the record the consumer delivered for the same rollout id, read back from the
rebuilt topic by the demo itself: for a scorable record, ``prompt_ids + completion_ids`` equal the
trajectory's ``token_ids``, the prompt carries no loss, ``env_mask`` equals the trajectory's
``loss_mask`` over the completion, every trained position's log-prob equals the captured one as
float32 (TRL holds them as a float32 tensor) and the reward is the record's. For a masked or
unrewarded record, nothing of the row is trained (``env_mask`` all 0) and its reward is None. An
empty list means the row is the record.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from schemas.records import RebuiltRollout

__all__ = ["TRL_DEMO_DIR", "DemoOptions", "DemoResult", "RowReport", "StepReport", "row_mismatches"]

TRL_DEMO_DIR = Path(".tokentrail/demo-trl")
TASKS = ("What is the weather in Paris?", "Is it warm in Lisbon today?", "Compare the weather in Oslo and Rome.")


class DemoOptions(BaseModel):
    """The demo's knobs, validated before anything starts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: int = Field(3, ge=1, description="GRPO optimizer steps, one group of rollouts each")
    group_size: int = Field(4, ge=2, description="rollouts per prompt (TRL's num_generations; also the batch)")
    engine: str = Field("vllm", pattern="^(reference|vllm)$", description="the engine the rollouts run on")
    variant: str = Field("crafted", pattern="^(crafted|random)$", description="the tiny checkpoint (vLLM serves it)")
    tool_calls: int = Field(2, ge=0, le=8, description="tool calls per rollout (the reference server's directive)")
    lr: float = Field(1e-5, gt=0.0, description="TRL's learning rate")
    max_completion_length: int = Field(1024, ge=8, description="TRL's max_completion_length")
    seed: int = Field(0, description="TRL's seed")
    deadline_s: float = Field(600.0, gt=0.0, description="the whole run gives up after this long")


def _f32(x: float) -> float:
    return float(struct.unpack("f", struct.pack("f", x))[0])


def row_mismatches(row: dict[str, Any], record: RebuiltRollout) -> list[str]:
    """How TRL's ``row`` differs from the delivered ``record`` (see the module docstring); [] when it is the record."""
    ids = row["prompt_ids"] + row["completion_ids"]
    cut, mask, logps = len(row["prompt_ids"]), row["env_mask"], row["logprobs"]
    out: list[str] = []
    if mask is None or len(mask) != len(row["completion_ids"]):
        return [f"env_mask has {None if mask is None else len(mask)} entries for {len(row['completion_ids'])} "
                "completion tokens"]
    reward = json.loads(record.result_json).get("reward")
    scorable = (not record.mask_sample and record.trajectory is not None and isinstance(reward, int | float)
                and math.isfinite(reward))
    if not scorable:
        if any(mask):
            out.append(f"the record is unscorable (mask_sample={record.mask_sample}, reward={reward!r}) "
                       f"but {sum(mask)} tokens are trained")
        if row["reward"] is not None:
            out.append(f"the record is unscorable but the row's reward is {row['reward']!r}")
        return out
    traj = record.trajectory
    assert traj is not None
    if ids != traj.token_ids:
        first = next((i for i, (a, b) in enumerate(zip(ids, traj.token_ids, strict=False)) if a != b),
                     min(len(ids), len(traj.token_ids)))
        out.append(f"token ids differ from the trajectory's at position {first} "
                   f"({len(ids)} in the row, {len(traj.token_ids)} delivered)")
        return out
    if any(traj.loss_mask[:cut]):
        out.append(f"the row's prompt (positions 0..{cut}) holds trained tokens of the record")
    if mask != list(traj.loss_mask[cut:]):
        out.append("env_mask differs from the trajectory's loss_mask over the completion")
    if logps is None:
        out.append("TRL holds no sampled log-probs for the row")
    else:
        # The record keeps one log-prob per trained token, in order (none on context).
        trained = [j for j, m in enumerate(mask) if m]
        bad = [cut + j for j, captured in zip(trained, traj.log_probs, strict=False) if logps[j] != _f32(captured)]
        if bad:
            out.append(f"{len(bad)} trained log-probs differ from the captured ones (first at position {bad[0]})")
    if row["reward"] != reward:
        out.append(f"reward {row['reward']!r} in the row, {reward!r} in the record")
    return out


@dataclass(frozen=True)
class RowReport:
    rollout_id: str
    mask_sample: bool
    reasons: list[str]
    reward: float | None
    advantage: float | None
    trained_tokens: int
    tokens: int
    calls: int
    mismatches: list[str]

    def line(self) -> str:
        mask = f"masked: {'; '.join(self.reasons) or '?'}" if self.mask_sample else "unmasked"
        reward = "None (unscorable)" if self.reward is None else f"{self.reward:.3f}"
        adv = "-" if self.advantage is None else f"{self.advantage:+.3f}"
        check = "row == delivered record" if not self.mismatches else "MISMATCH: " + "; ".join(self.mismatches)
        return (f"  {self.rollout_id}  mask_sample={self.mask_sample} ({mask})  reward {reward}  advantage {adv}  "
                f"{self.calls} calls, {self.trained_tokens}/{self.tokens} tokens trained  [{check}]")


@dataclass
class StepReport:
    step: int
    rows: list[RowReport]
    batch: list[dict[str, Any]] = field(default_factory=list)  # the rows as TRL held them (trainer/grpo.py)
    logs: dict[str, float] = field(default_factory=dict)  # TRL's log of the step: loss, grad_norm, reward, ...

    @property
    def masked_fraction(self) -> float:
        return sum(r.mask_sample or r.reward is None for r in self.rows) / max(len(self.rows), 1)

    @property
    def loss(self) -> float | None:
        return self.logs.get("loss")

    def line(self) -> str:
        rewards = ", ".join("None" if r.reward is None else f"{r.reward:.3f}" for r in self.rows)
        loss = "-" if self.loss is None else f"{self.loss:+.6f}"
        tie = ("\n  (rewards tie, so every GRPO advantage is 0 and nothing moves: the crafted checkpoint answers "
               "alike every time, the random one with no lowercase text; --engine reference samples different answers)"
               if self.rows and all(r.advantage == 0.0 for r in self.rows) else "")
        return (f"step {self.step}: rewards [{rewards}], masked/unscorable {self.masked_fraction:.0%}, "
                f"TRL loss {loss}, grad_norm {self.logs.get('grad_norm', float('nan')):.4g}, "
                f"reward mean {self.logs.get('reward', float('nan')):.3f}{tie}")


@dataclass
class DemoResult:
    steps: list[StepReport]
    engine: str
    topic: str  # where the consumer delivered the records

    @property
    def rows(self) -> list[RowReport]:
        return [row for step in self.steps for row in step.rows]

    @property
    def consistent(self) -> bool:
        return bool(self.rows) and not any(r.mismatches for r in self.rows)
