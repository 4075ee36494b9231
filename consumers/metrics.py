"""Prometheus metrics of one rebuild consumer (its own registry), served on ``--metrics-port``.

``tokentrail_consumer_policy_staleness``: a histogram of the policy staleness of every rollout
whose staleness is known (versions behind the current one when it was judged, right before
delivery); ``tokentrail_consumer_stale_rollouts_total{outcome}``: rollouts the ``max_staleness``
rule masked ``stale_policy`` (``masked``), dropped (``dropped``) or masked
``unknown_policy_version`` (``unknown``). Nothing is exported for a consumer that follows no
versions topic.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, start_http_server

__all__ = ["STALENESS_BUCKETS", "ConsumerMetrics"]

STALENESS_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 32, 64)


class ConsumerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.staleness = Histogram("tokentrail_consumer_policy_staleness",
                                   "Policy versions the oldest generated token of a rollout is behind the current one, "
                                   "when the consumer judged it", buckets=STALENESS_BUCKETS, registry=self.registry)
        self.stale = Counter("tokentrail_consumer_stale_rollouts", "Rollouts the max_staleness rule masked "
                             "(stale_policy), dropped, or masked for an unknown version", ["outcome"],
                             registry=self.registry)
        self._server: Any = None
        self.port: int | None = None

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Serve ``/metrics`` on ``host:port`` (0: a free port) from a daemon thread; the port bound."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self._server = server
        self.port = int(server.server_address[1])
        return self.port

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
