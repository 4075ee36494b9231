"""Rebuild rules: everything a rebuild may decide differently besides the snapshot (pure).

``rebuild(snapshot, rules)`` reads nothing else, so replay can re-run any
rollout under different rules and explain what changed. Rules are frozen,
validated at construction and round-trip through plain mappings
(``RebuildRules.from_mapping(rules.to_mapping())``), so a settings file, a CLI
flag and a replay request all name them the same way.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from schemas.errors import ConfigError

TERMINAL_METHODS = ("declared", "content", "heuristic")
DELIVERY_MODES = ("terminal", "gym")


@dataclass(frozen=True, slots=True, kw_only=True)
class RebuildRules:
    """Inputs to ``rebuild`` besides the snapshot. The defaults are the recommended ones.

    Delivery
    - ``delivery_mode``: ``"terminal"`` delivers the ancestry of the call that
      produced the harness's final answer and reports every other chain;
      ``"gym"`` reproduces NeMo Gym's decision (earliest root's chain; mask when
      roots != 1, chains != 1, or any unresolved parent or retry anywhere).
    - ``terminal_methods``: which evidence may attribute the terminal, in
      precedence order ``declared`` (the final response id names the call) >
      ``content`` (exactly one call produced the final text) > ``heuristic``
      (the unique extended leaf descending from the earliest extended root).
      When none applies, or one is ambiguous, the rollout is masked.
    - ``project_response``: also build NeMo RL's ``response.output`` projection
      (grows with calls x tokens; the compact trajectory is always built).
    - ``mask_late_writes``: mask a snapshot holding calls captured after the
      rollout was declared finished (its evidence changed after the fact).

    Side calls (excluded from the policy graph, reported as ``side_calls_excluded``)
    - ``side_call_models``: case-insensitive substrings of the requested model
      that mark a call as a side call (e.g. ``("haiku",)``).
    - ``policy_model``: the requested model of policy calls; calls requesting
      any other (non-empty) model are side calls. When unset and
      ``self_calibrate`` is on, the policy model is the requested model with the
      most generated tokens in the rollout (ties: the smaller name).
    - ``toolless_max_tokens``: a root call offered no tools, continued by no
      captured call, that generated at most this many tokens, in a rollout whose
      other calls do offer tools, is a side call (title/quota probes). 0 turns
      the rule off.
    """

    delivery_mode: str = "terminal"
    terminal_methods: tuple[str, ...] = TERMINAL_METHODS
    project_response: bool = True
    mask_late_writes: bool = True
    side_call_models: tuple[str, ...] = ()
    policy_model: str | None = None
    self_calibrate: bool = True
    toolless_max_tokens: int = 64

    def __post_init__(self) -> None:
        if self.delivery_mode not in DELIVERY_MODES:
            raise ConfigError(f"delivery_mode={self.delivery_mode!r}: must be one of {list(DELIVERY_MODES)}")
        methods = tuple(self.terminal_methods)
        unknown = [m for m in methods if m not in TERMINAL_METHODS]
        if unknown or len(set(methods)) != len(methods):
            raise ConfigError(
                f"terminal_methods={list(methods)!r}: each must be one of {list(TERMINAL_METHODS)}, at most once"
            )
        # Precedence is fixed; the rule only chooses which methods are allowed.
        object.__setattr__(self, "terminal_methods", tuple(m for m in TERMINAL_METHODS if m in methods))
        patterns = tuple(self.side_call_models)
        if any(not isinstance(p, str) or not p.strip() for p in patterns):
            raise ConfigError(f"side_call_models={list(patterns)!r}: patterns must be non-empty strings")
        object.__setattr__(self, "side_call_models", tuple(p.strip().lower() for p in patterns))
        if self.policy_model is not None and not self.policy_model.strip():
            raise ConfigError("policy_model must be a model name or unset, not an empty string")
        if not isinstance(self.toolless_max_tokens, int) or self.toolless_max_tokens < 0:
            raise ConfigError(f"toolless_max_tokens={self.toolless_max_tokens!r}: must be an integer >= 0")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> RebuildRules:
        """Rules from a plain mapping (settings, CLI JSON); unknown keys are refused by name."""
        values = dict(values or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown rebuild rule(s) {unknown}; known rules: {sorted(known)}")
        for name in ("terminal_methods", "side_call_models"):
            if name in values:
                if isinstance(values[name], str):
                    raise ConfigError(f"{name} must be a list of strings, not the string {values[name]!r}")
                values[name] = tuple(values[name])
        return cls(**values)

    def to_mapping(self) -> dict[str, Any]:
        """The rules as a JSON-ready mapping (lists for tuples)."""
        out = dataclasses.asdict(self)
        out["terminal_methods"] = list(self.terminal_methods)
        out["side_call_models"] = list(self.side_call_models)
        return out
