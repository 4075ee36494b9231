"""The end-of-run summary of ``tokentrail collect``: a pure function of the result rows.

Per task: rollouts, reward mean, masked count. Overall: rollouts, reward mean, masked
fraction with the reasons (mask codes, a failure row's class among them), failures per
class, and this invocation's wall time and rollouts per second (rows it wrote itself,
not rows a resumed run kept).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Summary", "summarize", "rollout_table"]


@dataclass(frozen=True)
class Summary:
    rollouts: int
    expected: int
    reward_mean: float | None
    masked: int
    mask_reasons: dict[str, int]
    failures: dict[str, int]
    per_task: dict[str, tuple[int, float, int]] = field(default_factory=dict)  # task -> (n, reward mean, masked)
    wall_s: float = 0.0
    written: int = 0  # rows this invocation wrote

    @property
    def rate(self) -> float:
        return self.written / self.wall_s if self.wall_s > 0 else 0.0

    def table(self) -> str:
        width = max([len("task"), *map(len, self.per_task)])
        lines = [f"{'task':<{width}}  {'n':>3}  {'reward':>6}  masked"]
        for task, (n, reward, masked) in sorted(self.per_task.items()):
            lines.append(f"{task:<{width}}  {n:>3}  {reward:>6.3f}  {masked}/{n}")
        return "\n".join(lines)

    def line(self) -> str:
        reward = "n/a" if self.reward_mean is None else f"{self.reward_mean:.3f}"
        frac = self.masked / self.rollouts if self.rollouts else 0.0
        reasons = ", ".join(f"{code} {n}" for code, n in sorted(self.mask_reasons.items(), key=lambda kv: (-kv[1], kv[0])))
        failures = ", ".join(f"{cls} {n}" for cls, n in sorted(self.failures.items())) or "none"
        return (f"collect: {self.rollouts}/{self.expected} rollouts, reward mean {reward}, masked {self.masked} "
                f"({frac:.1%}{': ' + reasons if reasons else ''}), failures: {failures}; wall {self.wall_s:.1f} s, "
                f"{self.rate:.2f} rollouts/s")


def summarize(rows: Iterable[dict[str, Any]], *, expected: int, wall_s: float = 0.0, written: int = 0) -> Summary:
    rows = list(rows)
    by_task: dict[str, list[dict[str, Any]]] = defaultdict(list)
    reasons: Counter[str] = Counter()
    failures: Counter[str] = Counter()
    masked = 0
    for row in rows:
        by_task[row["task_id"]].append(row)
        if row.get("failure_class"):
            failures[row["failure_class"]] += 1
        if row.get("mask_sample"):
            masked += 1
            for reason in row.get("mask_reasons") or []:
                reasons[reason.get("code", "?")] += 1
    rewards = [float(r["reward"]) for r in rows]
    per_task = {task: (len(rs), sum(float(r["reward"]) for r in rs) / len(rs), sum(1 for r in rs if r.get("mask_sample")))
                for task, rs in by_task.items()}
    return Summary(rollouts=len(rows), expected=expected, reward_mean=sum(rewards) / len(rewards) if rewards else None,
                   masked=masked, mask_reasons=dict(reasons), failures=dict(failures), per_task=per_task,
                   wall_s=wall_s, written=written)


def rollout_table(rows: Iterable[dict[str, Any]]) -> str:
    """One line per rollout: its id, reward, ``mask_sample`` and why (mask codes or the failure class)."""
    rows = sorted(rows, key=lambda r: (r["task_id"], r["sample"]))
    width = max([len("rollout"), *(len(r["rollout_id"]) for r in rows)])
    lines = [f"{'rollout':<{width}}  reward  mask_sample  why"]
    for r in rows:
        mask = "-" if r.get("mask_sample") is None else str(r["mask_sample"]).lower()
        why = ", ".join(x.get("code", "?") for x in r.get("mask_reasons") or []) or "-"
        lines.append(f"{r['rollout_id']:<{width}}  {float(r['reward']):>6.2f}  {mask:<11}  {why}")
    return "\n".join(lines)
