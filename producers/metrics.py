"""Prometheus metrics of one interceptor (its own registry, so several apps can live in one process)."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class InterceptorMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.captured = Counter("tokentrail_calls_captured", "Calls captured and acknowledged by Kafka",
                                registry=self.registry)
        self.incomplete = Counter("tokentrail_calls_incomplete", "Calls recorded as incomplete", ["reason"],
                                  registry=self.registry)
        self.publish_seconds = Histogram(
            "tokentrail_publish_seconds", "Time to an acks=all acknowledgement",
            buckets=(0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.02, 0.05,
                     0.1, 0.5, 1, 5, 30), registry=self.registry,
        )
        self.overhead_seconds = Histogram(
            "tokentrail_overhead_seconds", "Time a non-streaming call spent in the interceptor (not the engine), durable ack included",
            buckets=(0.0005, 0.001, 0.0015, 0.002, 0.0025, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.05, 0.1,
                     0.5, 1, 5),
            registry=self.registry,
        )
        self.spooled = Counter("tokentrail_events_spooled", "Events made durable in the local spool (Kafka down)",
                               registry=self.registry)
        self.refused = Counter("tokentrail_requests_refused", "Requests refused before any handler ran: a route "
                               "the route table does not allow, a missing rollout token, a malformed trace header, "
                               "a body over the limit, a capture call of a rollout this interceptor finished",
                               ["why"], registry=self.registry)
        self.spool_depth = Gauge("tokentrail_spool_depth", "Events in the local spool awaiting Kafka",
                                 registry=self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)
