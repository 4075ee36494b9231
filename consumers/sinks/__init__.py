"""Trainer sinks: the ``TrainerSink`` plugin point, the built-in JSONL and Kafka sinks, the in-process stream, the conformance kit."""

from schemas.surface import lazy_surface

__all__, __getattr__ = lazy_surface(__name__, {
    "TrainerSink": "consumers.sinks.plugin",
    "JsonlSink": "consumers.sinks.plugin",
    "load_sink": "consumers.sinks.plugin",
    "check_sink_class": "consumers.sinks.plugin",
    "KafkaSink": "consumers.sinks.kafka",
    "RolloutStream": "consumers.sinks.stream",
    "rollout_stream": "consumers.trainer_stream",
    "run_conformance": "consumers.sinks.conformance",
    "sample_rollout": "consumers.sinks.conformance",
    "SinkConformanceError": "consumers.sinks.conformance",
})
