"""The real-vLLM tier's gate: skip with the install command locally, fail under CI."""

from __future__ import annotations

import os

import pytest

from compose.vllm_engine.engine import unavailable_reason


def require_vllm() -> None:
    """Skip when the engine environment is missing, except under CI or TOKENTRAIL_REQUIRE_VLLM=1 (then fail)."""
    reason = unavailable_reason()
    if reason is None:
        return
    if os.environ.get("CI") or os.environ.get("TOKENTRAIL_REQUIRE_VLLM") == "1":
        pytest.fail(f"the real-vLLM tier must run here: {reason}")
    pytest.skip(reason)
