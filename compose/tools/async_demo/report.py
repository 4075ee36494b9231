"""What the async demo reads off a delivered record and prints: rollout rows, trainer steps, the result (pure).

A rollout's versions are its trajectory spans' ``version_spans`` (trajectory positions,
``[start, end)``). Its staleness is the consumer's (``_ng_token_capture.policy_staleness``, when
the consumer follows the versions topic), else computed here the same way: the trainer's current
step at delivery minus the oldest step among the rollout's version labels.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ASYNC_DEMO_DIR", "DemoOptions", "DemoResult", "StepReport", "rollout_row", "sample_of",
           "version_labels"]

ASYNC_DEMO_DIR = Path(".tokentrail/demo-async")


class DemoOptions(BaseModel):
    """The demo's knobs, validated before anything starts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: int = Field(4, ge=1, description="trainer steps, one per delivered group")
    group_size: int = Field(3, ge=2, description="rollouts per group (2 or more: the baseline is the group mean)")
    launchers: int = Field(2, ge=1, description="harness tasks launching groups concurrently")
    max_ahead: int = Field(2, ge=1, description="groups launched beyond the trainer's current step")
    max_tokens: int = Field(32, ge=1, le=1024, description="tokens per model call")
    lr: float = Field(5e-3, gt=0.0, description="Adam learning rate of the trainer")
    pause_mode: str = Field("keep", pattern="^(keep|wait|abort)$", description="push_weights' /pause mode")
    deadline_s: float = Field(300.0, gt=0.0, description="the loop gives up after this long")


@dataclass(frozen=True)
class StepReport:
    step: int
    label: str
    group: str
    size: int
    trained_on: int
    loss: float
    tokens: int
    train_s: float
    push_s: float
    mechanism: str
    announced_via: str
    on_policy_max_abs: float | None
    off_policy_mean_abs: float | None

    def line(self) -> str:
        on = "-" if self.on_policy_max_abs is None else f"{self.on_policy_max_abs:.1e}"
        off = "-" if self.off_policy_mean_abs is None else f"{self.off_policy_mean_abs:.3f}"
        return (f"trainer step {self.step} -> {self.label}: group {self.group} ({self.size} rollouts, "
                f"{self.trained_on} unmasked, {self.tokens} tokens) loss {self.loss:+.4f}, {self.train_s:.2f} s; "
                f"pushed by {self.mechanism} in {self.push_s:.2f} s, announced via {self.announced_via}\n"
                f"    |trainer log-prob - captured|: tokens of the trainer's weights max {on}, older tokens mean {off}")


@dataclass
class DemoResult:
    steps: list[StepReport]
    rollouts: list[dict[str, Any]]
    before: list[float]
    after: list[float]
    announced: list[str] = field(default_factory=list)
    engine_version: str = ""  # what the engine's /weight_info reported at the end

    @property
    def max_change(self) -> float:
        return max(abs(a - b) for a, b in zip(self.before, self.after, strict=True))

    @property
    def weights_changed(self) -> bool:
        return self.max_change > 0.0


def version_labels(record: dict[str, Any]) -> list[str]:
    """Every version label of the record's trajectory spans, in order of first appearance."""
    traj = record.get("trajectory") or {}
    seen: dict[str, None] = {}
    for span in traj.get("spans", ()):
        for v in span.get("version_spans", ()):
            seen.setdefault(v["version"], None)
    return list(seen)


def _spans_text(record: dict[str, Any]) -> str:
    traj = record.get("trajectory") or {}
    calls = ["+".join(f"{v['version']}[{v['start']}:{v['end']})" for v in span.get("version_spans", ())) or "-"
             for span in traj.get("spans", ())]
    return "  ".join(calls) or "-"


def rollout_row(record: dict[str, Any], rewards: dict[str, float], step_of: dict[str, int],
                current_step: int) -> dict[str, Any]:
    """One delivered rollout as the demo prints it, with the facts the test checks."""
    rid = record["rollout_id"]
    capture = record.get("_ng_token_capture") or {}
    labels = version_labels(record)
    if capture.get("policy_staleness") is not None:
        staleness, source = capture["policy_staleness"], "consumer"
    else:
        steps = [step_of.get(label) for label in labels]
        known = [s for s in steps if s is not None]
        staleness = current_step - min(known) if known and len(known) == len(steps) else None
        source = "computed"
    result = record.get("result") or {}
    reward = rewards.get(rid, result.get("reward") if isinstance(result, dict) else None)
    reasons = ",".join(r["code"] for r in record.get("mask_reasons", ())) or "-"
    crossed = any(len(s.get("version_spans", ())) > 1 for s in (record.get("trajectory") or {}).get("spans", ()))
    stale = "?" if staleness is None else str(staleness)
    line = (f"  rollout {rid.split('-', 1)[-1]:<8} reward {reward if reward is None else round(reward, 3)!s:<6} "
            f"mask {str(record['mask_sample']).lower():<5} ({reasons}) staleness {stale} ({source})  "
            f"versions {_spans_text(record)}{'  <- crossed an update mid-stream' if crossed else ''}")
    return {"rollout_id": rid, "labels": labels, "staleness": staleness, "staleness_source": source,
            "reward": reward, "mask_sample": record["mask_sample"], "crossed": crossed, "line": line}


def sample_of(record: dict[str, Any], rewards: dict[str, float]) -> dict[str, Any]:
    """What the trainer needs of one member: ids, loss mask, captured log-probs, a version per generated token."""
    rid = record["rollout_id"]
    traj = record.get("trajectory")
    result = record.get("result")
    if not isinstance(result, dict):
        result = {}
    reward = rewards.get(rid, result.get("reward"))
    masked = bool(record["mask_sample"]) or traj is None or not isinstance(reward, (int, float))
    if traj is None:
        return {"rollout_id": rid, "token_ids": [], "loss_mask": [], "log_probs": [], "versions": [],
                "reward": 0.0, "masked": True}
    spans = [(v["start"], v["end"], v["version"]) for s in traj["spans"] for v in s.get("version_spans", ())]
    versions = [next((label for start, end, label in spans if start <= t < end), "")
                for t, bit in enumerate(traj["loss_mask"]) if bit]
    return {"rollout_id": rid, "token_ids": traj["token_ids"], "loss_mask": traj["loss_mask"],
            "log_probs": traj["log_probs"], "versions": versions, "reward": float(reward or 0.0), "masked": masked}
