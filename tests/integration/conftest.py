"""Integration fixtures: a running tokentrail stack on the session's real broker, on both engines.

``upstream`` is parametrised: every test that uses ``stack`` runs against the reference
policy server and against real vLLM (its CPU build on the crafted tiny checkpoint,
marked ``vllm``). Without the engine environment the vLLM half is skipped with the
command that installs it, except under CI or ``TOKENTRAIL_REQUIRE_VLLM=1``, where a
missing engine fails the run instead of passing it silently.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from compose.stack import LocalStack
from compose.vllm_engine.engine import VllmEngine
from tests.integration.engines import require_vllm

UPSTREAMS = ["reference", pytest.param("vllm", marks=pytest.mark.vllm)]


@pytest.fixture(scope="session")
def vllm_engine(tmp_path_factory) -> Iterator[VllmEngine]:
    """Real vLLM on the crafted checkpoint, max_model_len 32768, dev-mode routes on (pause, weight versions)."""
    require_vllm()
    with VllmEngine(tmp_path_factory.mktemp("vllm"), env={"VLLM_SERVER_DEV_MODE": "1"}) as engine:
        yield engine


@pytest.fixture(scope="module", params=UPSTREAMS)
def upstream(request) -> str | None:
    """None: spawn the reference server; else the URL of the running real engine."""
    if request.param == "reference":
        return None
    return request.getfixturevalue("vllm_engine").url


@pytest.fixture(scope="module")
def stack(kafka_bootstrap, tmp_path_factory, upstream):
    """Engine, interceptor, processor and consumer as processes, on topics of their own."""
    tag = uuid.uuid4().hex[:8]
    with LocalStack(kafka_bootstrap, tmp_path_factory.mktemp("stack"), topic_prefix=f"it{tag}.",
                    processor_id=f"it{tag}", upstream_url=upstream) as running:
        yield running
