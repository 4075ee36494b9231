"""Chaos under load (`tokentrail chaos`, `make chaos`): concurrent rollouts while the stack's parts are killed.

``workload`` drives the rollouts, ``faults`` injects the kills and restarts what died,
``killsink`` is the TrainerSink plugin that crashes its consumer between deliver and retire,
``accounting`` (pure) compares what was acknowledged with what was delivered and renders
the table, ``run`` wires one run together, ``cli`` is the subcommand.
"""
