"""The real OpenAI Codex CLI, pinned, installed repo-locally and run non-interactively and offline.

The twin of ``compose.harnesses.claude_code`` for the Responses-API harness. It guarantees:

* One pin. ``CODEX_VERSION`` equals the version in ``compose/harnesses/codex/package.json`` and
  ``package-lock.json`` (the lockfile carries the registry's sha512 for the wrapper and for every
  platform binary); a unit test keeps the three in step.
* Install (``ensure_codex()`` or ``python -m compose.harnesses.codex install``): ``npm ci --ignore-scripts``
  into ``.tokentrail/codex/`` (git-ignored) when the pinned binary is not already there;
  idempotent and flock-serialized; npm caches the tarballs (``~/.npm``). The npm package
  ``@openai/codex`` is a small Node wrapper; its optional dependency ``@openai/codex-<platform>``
  (an npm alias of ``@openai/codex@<version>-<platform>``, served by the npm registry like
  everything else; no install script downloads anything) holds the native Rust executable
  (``vendor/<triple>/bin/codex``, ~300 MB; static musl on Linux). That executable is what is
  returned and run: no Node.js at run time; npm is needed only to install.
* Offline, isolated runs (``run_codex()``): ``codex exec --json`` against one Responses-API base
  URL through a custom model provider in a generated ``config.toml`` in a throw-away
  ``CODEX_HOME`` (``wire_api = "responses"``, a dummy key through ``env_key``, no login), update
  checks, analytics, feedback, OpenTelemetry, plugin/app sync and web search off, approvals
  ``never``, sandbox ``danger-full-access``. The only HTTP the CLI then makes is ``POST
  {base_url}/responses`` (streaming). See ``compose.harnesses.codex.runner`` for the exact request and the
  default shell tool (``exec_command`` with ``{"cmd": "<shell command>"}``).
* No process outlives a run: the CLI runs under a small subreaper parent that, when the CLI exits
  or at the timeout, kills everything the CLI's tools left running (``compose.procs.headless``,
  shared with ``compose.harnesses.claude_code``, as the install is ``compose.harnesses.npm``'s).
* ``RecordingResponsesStub``: a stdlib HTTP server that speaks enough of the Responses API (SSE
  and JSON, message and function_call items, errors) for the CLI to finish multi-turn tool-using
  sessions, and records every request.
"""

from __future__ import annotations

from compose.harnesses.codex.install import (
    CODEX_PACKAGE,
    CODEX_VERSION,
    PIN_DIR,
    CodexUnavailable,
    binary_path,
    ensure_codex,
    install_dir,
    installed_version,
    platform_package,
    target_triple,
)
from compose.harnesses.codex.runner import (
    API_KEY_ENV,
    DEFAULT_MODEL,
    OFFLINE_CONFIG,
    CodexResult,
    codex_argv,
    codex_config,
    codex_env,
    parse_events,
    run_codex,
    to_toml,
)
from compose.harnesses.codex.stub import (
    RecordedRequest,
    RecordingResponsesStub,
    Reply,
    error_reply,
    exec_command_call,
    function_call,
    scripted,
    text_reply,
)

__all__ = [
    "API_KEY_ENV", "CODEX_PACKAGE", "CODEX_VERSION", "DEFAULT_MODEL", "OFFLINE_CONFIG", "PIN_DIR",
    "CodexResult", "CodexUnavailable", "RecordedRequest", "RecordingResponsesStub", "Reply", "binary_path",
    "codex_argv", "codex_config", "codex_env", "ensure_codex", "error_reply", "exec_command_call",
    "function_call", "install_dir", "installed_version", "parse_events", "platform_package", "run_codex",
    "scripted", "target_triple", "text_reply", "to_toml",
]
