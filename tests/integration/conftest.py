"""Integration fixtures: a running tokentrail stack on the session's real broker."""

from __future__ import annotations

import uuid

import pytest

from compose.stack import LocalStack


@pytest.fixture(scope="module")
def stack(kafka_bootstrap, tmp_path_factory):
    """Policy server, interceptor, processor and consumer as processes, on topics of their own."""
    tag = uuid.uuid4().hex[:8]
    with LocalStack(kafka_bootstrap, tmp_path_factory.mktemp("stack"), topic_prefix=f"it{tag}.",
                    processor_id=f"it{tag}") as running:
        yield running
