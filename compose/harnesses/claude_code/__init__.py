"""The real Claude Code CLI, pinned, installed repo-locally and run headless and offline.

ARCHITECTURE §7 drives the interceptor end to end with the Claude Code CLI from the npm
registry. This module makes that reproducible from a clean clone. It guarantees:

* One pin. ``CLAUDE_CODE_VERSION`` equals the version in ``compose/harnesses/claude_code/package.json``
  and ``package-lock.json`` (the lockfile carries the registry's sha512 for the wrapper and for
  every platform binary); a unit test keeps the three in step.
* Install (``ensure_claude_code()`` or ``python -m compose.harnesses.claude_code install``): ``npm ci
  --ignore-scripts`` into ``.tokentrail/claude-code/`` (git-ignored) when the pinned binary is
  not already there; idempotent and flock-serialized. npm keeps the tarballs in its cache
  (``~/.npm`` by default, ``npm_config_cache`` to move it). The npm package is a thin wrapper;
  its optional dependency ``@anthropic-ai/claude-code-<platform>`` holds a self-contained
  native executable (~400 MB, a bundled JS runtime). That executable is what is returned and
  run: no Node.js at run time, and the wrapper's postinstall (which only hard-links the binary
  over the ``bin/claude.exe`` placeholder) never has to run, so ``node_modules/.bin/claude``
  stays a placeholder that prints an error. npm is needed only to install.
* Offline, isolated runs (``run_claude_code()``): ``claude -p ... --output-format stream-json``
  against one Anthropic Messages base URL, with a fresh throw-away HOME/CLAUDE_CONFIG_DIR/XDG
  dirs/TMPDIR (the user's ``~/.claude`` is never read or written), an environment built from
  scratch (no inherited ``ANTHROPIC_*``, proxy or cloud-provider variables), non-essential
  traffic, telemetry, error reporting and auto-update off, no settings files, no MCP servers,
  no session persistence. With that, the only HTTP the CLI makes is ``POST
  {base_url}/v1/messages?beta=true`` (streaming). It works as root (the CLI refuses
  ``--dangerously-skip-permissions``/``bypassPermissions`` as root): tools are allowed with
  ``--allowedTools`` rules such as ``Bash(echo:*)``.
* No process outlives a run: the CLI runs under a small subreaper parent that, when the CLI
  exits or at the timeout, kills everything the CLI's tools left running (background jobs,
  ``nohup``, ``setsid`` and double forks included). That is ``compose.procs.headless``, shared
  with ``compose.harnesses.codex``, as the install is ``compose.harnesses.npm``'s.
* ``RecordingAnthropicStub``: a stdlib HTTP server that speaks enough of the Messages API
  (SSE and JSON, thinking/text/tool_use blocks, errors, ``count_tokens``, ``models``) for the
  CLI to finish multi-turn tool-using sessions, records every request and answer, and is
  deterministic given a ``scripted`` responder; ``record_scenario``/``write_fixtures`` (``python
  -m compose.harnesses.claude_code record-fixtures tests/fixtures/claude_code``) regenerate the sanitized
  request fixtures byte-for-byte.
"""

from __future__ import annotations

from compose.harnesses.claude_code.fixtures import (
    FIXTURE_FINAL,
    SCENARIOS,
    Recording,
    compact_json,
    record_scenario,
    write_fixtures,
)
from compose.harnesses.claude_code.install import (
    CLAUDE_CODE_PACKAGE,
    CLAUDE_CODE_VERSION,
    PIN_DIR,
    ClaudeCodeUnavailable,
    binary_path,
    ensure_claude_code,
    install_dir,
    platform_package,
)
from compose.harnesses.claude_code.runner import ClaudeCodeResult, claude_code_env, run_claude_code
from compose.harnesses.claude_code.stub import (
    RecordedRequest,
    RecordingAnthropicStub,
    Reply,
    bash_then_text,
    bash_tool_use,
    scripted,
    text_reply,
)

__all__ = [
    "FIXTURE_FINAL", "PIN_DIR", "SCENARIOS", "Recording", "Reply", "compact_json", "record_scenario", "write_fixtures",
    "CLAUDE_CODE_PACKAGE", "CLAUDE_CODE_VERSION", "ClaudeCodeResult", "ClaudeCodeUnavailable", "RecordedRequest",
    "RecordingAnthropicStub", "bash_then_text", "bash_tool_use", "binary_path", "claude_code_env",
    "ensure_claude_code", "install_dir", "platform_package", "run_claude_code", "scripted", "text_reply",
]
