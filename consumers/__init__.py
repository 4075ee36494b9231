"""The trainer side: rebuild frozen rollouts into token-exact trajectories and deliver them.

Public surface (resolved lazily, so importing the package pulls in no framework):
``RebuildRules`` (the pure rebuild is ``consumers.rebuild.rebuild``), ``RebuildConsumer`` and
``ConsumerSettings`` (the consumer), ``TrainerSink`` and ``load_sink`` (the sink plugin
point), ``rollout_stream`` (the in-process stream), ``run_conformance`` (the sink kit), the
Gym adapters ``TokenSink`` / ``TokenSource`` / ``TokenLineage``, and ``EventLog`` /
``replay_rollout`` (replay and diagnosis).
"""

from schemas.surface import lazy_surface

__all__, __getattr__ = lazy_surface(__name__, {
    "RebuildRules": "consumers.rebuild",
    "RebuildConsumer": "consumers.loop",
    "ConsumerSettings": "consumers.settings",
    "TrainerSink": "consumers.sinks.plugin",
    "load_sink": "consumers.sinks.plugin",
    "rollout_stream": "consumers.trainer_stream",
    "run_conformance": "consumers.sinks.conformance",
    "TokenSink": "consumers.gym.adapters",
    "TokenSource": "consumers.gym.adapters",
    "TokenLineage": "consumers.gym.adapters",
    "EventLog": "consumers.replay.eventlog",
    "replay_rollout": "consumers.replay.rollouts",
})
