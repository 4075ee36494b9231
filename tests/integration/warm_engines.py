"""The session's real-vLLM engines, started in the background as soon as the run knows it needs them.

A vLLM CPU engine takes 35-75 s to start on this 2-core machine, and the session needs two (the
crafted and the random checkpoint). The unit tier runs single-threaded first (the vLLM tier runs
last, ``tests/conftest.py``), leaving a core idle: ``prewarm`` starts the engines the selected
tests will ask for on that core, niced (``VllmEngine.nice``), and ``session_engine`` hands the
started engine to its fixture, waiting for it only if it is not up yet. Guarantees: each engine
starts at most once per session; a start that failed raises its error in every fixture that asks
for it; ``stop_all`` (at session end) stops every engine started here, used or not.
The in-engine (middleware) engine needs the session's broker when it starts: it is pre-warmed
only when the broker is known at collection (``KAFKA_BOOTSTRAP``, as in CI), else started by its
fixture. ``TOKENTRAIL_PREWARM=0`` starts engines only when a fixture asks.
"""

from __future__ import annotations

import os
import tempfile
import threading
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from compose.engines.vllm_rig.engine import VllmEngine, unavailable_reason
from compose.engines.vllm_rig.pace import FLAGS as PACE_FLAGS

__all__ = ["MIDDLEWARE", "SESSION_ENGINES", "engines_needed", "prewarm", "session_engine", "stop_all"]

# The in-engine interceptor's settings (its topics' prefix is this session's own).
MIDDLEWARE = {"TOKENTRAIL_TOPIC_PREFIX": f"mw{uuid.uuid4().hex[:8]}.", "TOKENTRAIL_CONTROL_TOKEN": "tokentrail-demo-token",
              "TOKENTRAIL_ROLLOUT_SECRET": "e2e-rollout-secret-0123456789abcdef"}

# fixture name -> the engine it serves (the first two with the dev-mode routes: pause, weight versions)
SESSION_ENGINES: dict[str, dict[str, Any]] = {
    "vllm_engine": {"variant": "crafted", "env": {"VLLM_SERVER_DEV_MODE": "1"}},
    # Paced decode on request (compose.engines.vllm_rig.pace): the weight-update tests need a known engine speed.
    "vllm_random_engine": {"variant": "random", "env": {"VLLM_SERVER_DEV_MODE": "1"},
                           "extra_args": PACE_FLAGS},
    # The crafted checkpoint served with --middleware producers.middleware.TokentrailMiddleware.
    "vllm_middleware_engine": {"variant": "crafted", "env": MIDDLEWARE, "needs_bootstrap": True,
                               "extra_args": ("--middleware", "producers.middleware.TokentrailMiddleware")},
}

_lock = threading.Lock()
_starting: dict[str, Future[VllmEngine]] = {}
_engines: list[VllmEngine] = []
_pool = ThreadPoolExecutor(max_workers=len(SESSION_ENGINES), thread_name_prefix="vllm-warm")


def engines_needed(items: list[Any]) -> set[str]:
    """The session engines the selected real-vLLM tests use (directly, or through the ``stack`` upstream)."""
    needed: set[str] = set()
    for item in items:
        if item.get_closest_marker("vllm") is None:
            continue
        names = set(getattr(item, "fixturenames", ()))
        needed |= names & SESSION_ENGINES.keys()
        callspec = getattr(item, "callspec", None)
        if "upstream" in names and callspec is not None and callspec.params.get("upstream") == "vllm":
            needed.add("vllm_engine")
    return needed


def prewarm(names: set[str]) -> None:
    """Start each named engine in the background (no-op without the engine environment, or when asked not to)."""
    if os.environ.get("TOKENTRAIL_PREWARM") == "0" or unavailable_reason() is not None:
        return
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP")
    for name in sorted(names):
        if bootstrap or not SESSION_ENGINES[name].get("needs_bootstrap"):
            _submit(name, bootstrap)


def session_engine(name: str, bootstrap: str | None = None) -> VllmEngine:
    """The started engine for fixture ``name``: the pre-warmed one, or started now (on ``bootstrap``)."""
    return _submit(name, bootstrap).result()


def stop_all() -> None:
    with _lock:
        pending = list(_starting.values())
    for future in pending:
        try:
            future.result()
        except Exception:  # a failed start left nothing running; its fixture reported it
            pass
    with _lock:
        engines, _engines[:] = list(_engines), []
    for engine in engines:
        engine.stop()


def _submit(name: str, bootstrap: str | None) -> Future[VllmEngine]:
    with _lock:
        if name not in _starting:
            _starting[name] = _pool.submit(_start, name, bootstrap)
        return _starting[name]


def _start(name: str, bootstrap: str | None) -> VllmEngine:
    spec = SESSION_ENGINES[name]
    env = dict(spec["env"])
    if spec.get("needs_bootstrap"):
        assert bootstrap, f"{name} starts on the session's broker"
        env["TOKENTRAIL_BOOTSTRAP"] = bootstrap
    engine = VllmEngine(Path(tempfile.mkdtemp(prefix=f"tokentrail-{name}-")), variant=spec["variant"], env=env,
                        extra_args=tuple(spec.get("extra_args", ())))
    with _lock:
        _engines.append(engine)  # stopped at session end even if its start fails half way
    return engine.start()
