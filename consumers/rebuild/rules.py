"""Rebuild rules: everything a rebuild may decide differently besides the snapshot (pure).

``rebuild(snapshot, rules)`` reads nothing else, so replay can re-run any
rollout under different rules and explain what changed. Rules are frozen,
validated at construction and round-trip through plain mappings
(``RebuildRules.from_mapping(rules.to_mapping())``), so a settings file, a CLI
flag and a replay request all name them the same way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from schemas.errors import ConfigError
from schemas.records import TraceKind

TERMINAL_METHODS = ("declared", "content", "heuristic")
DELIVERY_MODES = ("terminal", "gym", "traces")
TRACE_KINDS = tuple(kind.value for kind in TraceKind)


@dataclass(frozen=True, slots=True, kw_only=True)
class RebuildRules:
    """Inputs to ``rebuild`` besides the snapshot. The defaults are the recommended ones.

    Delivery
    - ``delivery_mode``: ``"terminal"`` delivers the ancestry of the call that
      produced the harness's final answer and reports every other chain;
      ``"gym"`` reproduces NeMo Gym's decision (earliest root's chain; mask when
      roots != 1, chains != 1, or any unresolved parent or retry anywhere);
      ``"traces"`` delivers what ``"terminal"`` does and, in ``traces``, the
      whole verified forest: every trace labelled (``consumers.rebuild.traces``).
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

    Traces (``delivery_mode="traces"``)
    - ``subagent_tools``: tool names whose call starts a sub-agent (Claude Code's
      ``Agent``, formerly ``Task``; Codex's ``spawn_agent``); the call's
      ``prompt`` (Codex: ``message``) argument is the sub-agent's opening
      message, its ``subagent_type`` or ``agent_type`` (else ``description``)
      the label.
    - ``compaction_min_tokens``: a root that carries a window of this many
      tokens of an earlier leaf's generation (the middle and 8 evenly spaced windows)
      starts a compaction segment linked to that call, the latest such leaf (a
      shorter generation never links: too short to tell a summary from a
      coincidence).
    - ``train_summaries``: a compaction summary's generation is loss-bearing in
      the segment that produced it; off, it is context only.
    - ``mask_rollout_kinds``: a masked trace of one of these kinds masks the
      rollout (``trace_masked``); others mask only themselves.
    """

    delivery_mode: str = "terminal"
    terminal_methods: tuple[str, ...] = TERMINAL_METHODS
    project_response: bool = True
    mask_late_writes: bool = True
    side_call_models: tuple[str, ...] = ()
    policy_model: str | None = None
    self_calibrate: bool = True
    toolless_max_tokens: int = 64
    subagent_tools: tuple[str, ...] = ("Agent", "Task", "spawn_agent")
    compaction_min_tokens: int = 16
    train_summaries: bool = True
    mask_rollout_kinds: tuple[str, ...] = ("main", "compaction")

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
        tools = tuple(self.subagent_tools)
        if any(not isinstance(t, str) or not t.strip() for t in tools):
            raise ConfigError(f"subagent_tools={list(tools)!r}: tool names must be non-empty strings")
        object.__setattr__(self, "subagent_tools", tools)
        if not isinstance(self.compaction_min_tokens, int) or self.compaction_min_tokens < 1:
            raise ConfigError(f"compaction_min_tokens={self.compaction_min_tokens!r}: must be an integer >= 1")
        kinds = tuple(self.mask_rollout_kinds)
        if any(k not in TRACE_KINDS for k in kinds):
            raise ConfigError(f"mask_rollout_kinds={list(kinds)!r}: each must be one of {list(TRACE_KINDS)}")
        object.__setattr__(self, "mask_rollout_kinds", tuple(k for k in TRACE_KINDS if k in kinds))

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> RebuildRules:
        """Rules from a plain mapping (settings, CLI JSON); unknown keys are refused by name."""
        values = dict(values or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown rebuild rule(s) {unknown}; known rules: {sorted(known)}")
        for name in _LIST_RULES:
            if name in values:
                if isinstance(values[name], str):
                    raise ConfigError(f"{name} must be a list of strings, not the string {values[name]!r}")
                values[name] = tuple(values[name])
        return cls(**values)

    def to_mapping(self) -> dict[str, Any]:
        """The rules as a JSON-ready mapping (lists for tuples)."""
        out = dataclasses.asdict(self)
        for name in _LIST_RULES:
            out[name] = list(getattr(self, name))
        return out


_LIST_RULES = ("terminal_methods", "side_call_models", "subagent_tools", "mask_rollout_kinds")
