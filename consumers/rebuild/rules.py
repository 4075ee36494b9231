"""Rebuild rules: what a rebuild may decide differently (replay can re-decide under new rules)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class RebuildRules:
    """Inputs to ``rebuild`` besides the snapshot. Defaults are the safe, Gym-compatible ones.

    - ``project_response``: also build NeMo RL's ``response.output`` projection
      (grows with calls × tokens; the compact trajectory is always built).
    - ``mask_late_writes``: a snapshot that includes calls captured after the
      rollout was declared finished is masked (its evidence changed after the fact).
    """

    project_response: bool = True
    mask_late_writes: bool = True
