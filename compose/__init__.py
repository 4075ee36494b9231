"""compose: the `tokentrail` command and everything around the runtime, sorted by role.

The runtime is ``schemas``, ``producers``, ``processors`` and ``consumers``; nothing there
imports this package. Here, from the top down (an import-linter ``layers`` contract in
pyproject.toml keeps each role to the ones below it):

- ``cli``: the ``tokentrail`` command, one subcommand per process or tool.
- ``ops``: operator commands of the runtime (``topics``, ``versions``, ``replay``); ``collect``:
  ``tokentrail collect``, the rollout collector; ``tools``: benchmarks, chaos, the demos.
  These three are independent of each other.
- ``rig``: the local stack: the jar Kafka broker, the services as processes, scale-out.
- ``harnesses``: what drives the interceptor as a user would (the SDK harness, the Claude Code
  and Codex CLIs); ``engines``: what serves it (the reference policy server, the vLLM rig).
- ``procs``: child processes: spawning services, picking ports, running a CLI headless.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["REPO_ROOT"]

# The checkout this package runs from: state (.tokentrail/), the jars (.kafka/) and the engine's
# environment (.venv-vllm/) live beside it.
REPO_ROOT = Path(__file__).resolve().parent.parent
