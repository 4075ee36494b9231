"""Trainer sinks: the ``TrainerSink`` plugin point, the built-in JSONL and Kafka sinks, the in-process stream, the conformance kit."""
