"""Integration fixtures: a running tokentrail stack on the session's real broker, on both engines.

``upstream`` is parametrised: every test that uses ``stack`` runs against the reference
policy server and against real vLLM (its CPU build on the crafted tiny checkpoint,
marked ``vllm``). Without the engine environment the vLLM half is skipped with the
command that installs it, except under CI or ``TOKENTRAIL_REQUIRE_VLLM=1``, where a
missing engine fails the run instead of passing it silently.
"""

from __future__ import annotations

import shutil
import uuid

import pytest

from compose.engines.vllm_rig.engine import VllmEngine
from compose.rig.stack import LocalStack
from tests.integration.engines import require_vllm
from tests.integration.warm_engines import session_engine

UPSTREAMS = ["reference", pytest.param("vllm", marks=pytest.mark.vllm)]


@pytest.fixture(scope="session")
def vllm_engine() -> VllmEngine:
    """Real vLLM on the crafted checkpoint, max_model_len 32768, dev-mode routes on (pause, weight versions).

    Started in the background while the earlier tiers run (``tests/integration/warm_engines.py``).
    """
    require_vllm()
    return session_engine("vllm_engine")


@pytest.fixture(scope="session")
def vllm_random_engine() -> VllmEngine:
    """Real vLLM on the random checkpoint (no two samples alike), max_model_len 32768, dev-mode routes on.

    Shared, to start one engine fewer per module: a test that pushes weights or sets the label
    puts the served weights back before it ends (the label may differ from "default").
    """
    require_vllm()
    return session_engine("vllm_random_engine")


@pytest.fixture(scope="session")
def vllm_middleware_engine(kafka_bootstrap) -> VllmEngine:
    """Real vLLM on the crafted checkpoint with the interceptor inside it (``--middleware``), on the session's
    broker, its settings ``warm_engines.MIDDLEWARE``."""
    require_vllm()
    return session_engine("vllm_middleware_engine", kafka_bootstrap)


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


def _pinned_cli(ensure, unavailable: type[Exception], what: str):
    """The pinned harness CLI, installed from npm if needed; skipped when npm is missing."""
    try:
        return ensure()  # no npm needed when the pinned CLI is already installed
    except unavailable:
        if shutil.which("npm") is None:
            pytest.skip(f"npm is not installed: the {what} CLI comes from the npm registry")
        raise


@pytest.fixture(scope="module")
def claude():
    """The real Claude Code CLI's binary (``make claude-code``)."""
    from compose.harnesses.claude_code import ClaudeCodeUnavailable, ensure_claude_code

    return _pinned_cli(ensure_claude_code, ClaudeCodeUnavailable, "Claude Code")


@pytest.fixture(scope="module")
def codex():
    """The real Codex CLI's binary (``make codex``)."""
    from compose.harnesses.codex import CodexUnavailable, ensure_codex

    return _pinned_cli(ensure_codex, CodexUnavailable, "Codex")


@pytest.fixture(scope="module")
def gemini_cli():
    """The real Gemini CLI's entry script (``make gemini-cli``), run by Node.js >= 20."""
    from compose.harnesses.gemini_cli import GeminiCliUnavailable, ensure_gemini_cli, node_executable

    entry = _pinned_cli(ensure_gemini_cli, GeminiCliUnavailable, "Gemini")
    try:
        node_executable()
    except GeminiCliUnavailable as exc:
        pytest.skip(str(exc))
    return entry
