"""The real Google Gemini CLI, pinned, installed repo-locally and run headless and offline.

The Gemini-API twin of ``compose.harnesses.claude_code`` and ``compose.harnesses.codex``. It guarantees:

* One pin. ``GEMINI_CLI_VERSION`` equals the version in ``compose/harnesses/gemini_cli/package.json``
  and ``package-lock.json`` (the lockfile carries the registry's sha512 of every package); a unit
  test keeps the three in step.
* Install (``ensure_gemini_cli()`` or ``python -m compose.harnesses.gemini_cli install``): ``npm ci
  --ignore-scripts`` into ``.tokentrail/gemini-cli/`` (git-ignored) when the pinned version is not
  already there; idempotent and flock-serialized (``compose.harnesses.npm``). ``@google/gemini-cli``
  is one esbuild bundle, not a native executable: it runs as ``node bundle/gemini.js``, so Node.js
  >= 20 is needed at run time as well (``node_executable`` checks it, naming the fix).
* Offline, isolated runs (``run_gemini_cli()``): ``--prompt=... --approval-mode yolo -m <model>
  --output-format stream-json`` against one Gemini API base URL (``GOOGLE_GEMINI_BASE_URL``, whose
  path prefix the SDK keeps), API-key auth (``GEMINI_API_KEY``, also sent as a Bearer token), a
  throw-away HOME whose ``.gemini/settings.json`` switches off usage statistics, telemetry, update
  checks, IDE integration, checkpointing, folder trust, the utility-model side calls and the
  web tools (``OFFLINE_SETTINGS``). The only HTTP the CLI then makes is ``POST
  {base_url}/v1beta/models/{model}:streamGenerateContent?alt=sse``; ``compose.harnesses.gemini_cli.runner``
  says exactly what it sends and what it sends back.
* No process outlives a run (``compose.procs.headless``'s subreaper), and ``timeout`` bounds the
  CLI's own retries.
* ``RecordingGeminiStub``: a stdlib HTTP server that speaks enough of the Gemini API
  (``streamGenerateContent`` SSE, ``generateContent``, ``countTokens``, errors) for the CLI to
  finish multi-turn tool-using sessions, and records every request; ``record_scenario`` /
  ``write_fixtures`` (``python -m compose.harnesses.gemini_cli record-fixtures tests/fixtures/gemini_cli``)
  regenerate the sanitized, trimmed request fixtures byte-for-byte.
"""

from __future__ import annotations

from compose.harnesses.gemini_cli.fixtures import (
    FIXTURE_FINAL,
    FIXTURE_PROMPT,
    SCENARIOS,
    Recording,
    record_scenario,
    write_fixtures,
)
from compose.harnesses.gemini_cli.install import (
    GEMINI_CLI_PACKAGE,
    GEMINI_CLI_VERSION,
    PIN_DIR,
    GeminiCliUnavailable,
    ensure_gemini_cli,
    entry_path,
    install_dir,
    installed_version,
    node_executable,
)
from compose.harnesses.gemini_cli.runner import (
    DEFAULT_MODEL,
    OFFLINE_SETTINGS,
    GeminiCliResult,
    gemini_argv,
    gemini_env,
    gemini_settings,
    run_gemini_cli,
)
from compose.harnesses.gemini_cli.stub import (
    SHELL_TOOL,
    RecordedRequest,
    RecordingGeminiStub,
    Reply,
    error_reply,
    function_call,
    scripted,
    shell_call,
    text_reply,
)
from compose.harnesses.recorded_fixtures import compact_json

__all__ = [
    "DEFAULT_MODEL", "FIXTURE_FINAL", "FIXTURE_PROMPT", "GEMINI_CLI_PACKAGE", "GEMINI_CLI_VERSION",
    "OFFLINE_SETTINGS", "PIN_DIR", "SCENARIOS", "SHELL_TOOL", "GeminiCliResult", "GeminiCliUnavailable",
    "RecordedRequest", "Recording", "RecordingGeminiStub", "Reply", "compact_json", "ensure_gemini_cli",
    "entry_path", "error_reply", "function_call", "gemini_argv", "gemini_env", "gemini_settings",
    "install_dir", "installed_version", "node_executable", "record_scenario", "run_gemini_cli", "scripted",
    "shell_call", "text_reply", "write_fixtures",
]
