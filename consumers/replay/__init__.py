"""Replay and diagnosis: read a rollout back from the event log, fold and rebuild it, explain or summarise the masks."""

from schemas.surface import lazy_surface

__all__, __getattr__ = lazy_surface(__name__, {
    "EventLog": "consumers.replay.eventlog",
    "replay_rollout": "consumers.replay.rollouts",
    "ReplayResult": "consumers.replay.rollouts",
    "rule_changes": "consumers.replay.rollouts",
    "summarize": "consumers.replay.summary",
    "render_html": "consumers.replay.report_html",
})
