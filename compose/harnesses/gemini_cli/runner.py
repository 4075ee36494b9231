"""Run the Gemini CLI headless and offline against one Gemini API base URL; no process outlives a run.

What the CLI sends (``@google/gemini-cli`` 0.61.0, with the settings this module writes)
-----------------------------------------------------------------------------------------

One ``POST {base_url}/v1beta/models/{model}:streamGenerateContent?alt=sse`` per model turn (the
base URL's path is kept as a prefix, so the interceptor's
``http://host:port/ng-rollout/<id>/training-token-capture`` works as it is). Body keys exactly
``contents``, ``systemInstruction`` (``{"role": "user", "parts": [{"text": ~25 KB}]}``), ``tools``
(one ``{"functionDeclarations": [...]}``, each ``name``/``description``/``parametersJsonSchema``)
and ``generationConfig`` (``temperature`` 1, ``topP`` 0.95, ``topK`` 64, ``thinkingConfig:
{"includeThoughts": true}`` for a model name the CLI does not know). The first user content holds
a ``<session_context>`` part (date, OS, the project temp dir under HOME, the working directory's
listing) and the prompt. Headers: ``x-goog-api-key: <key>`` and, with
``GEMINI_API_KEY_AUTH_MECHANISM=bearer`` (set here), ``Authorization: Bearer <key>`` as well, so the
interceptor's admission reads the rollout token; ``User-Agent: GeminiCLI-tui/0.61.0/<model> ...``.
Nothing else: no ``countTokens``, no model list, no telemetry (``OFFLINE_SETTINGS``; checked with
``strace -e connect``: the only socket is the base URL's). The utility side calls (next-speaker
check, LLM loop detection: non-streamed ``:generateContent`` on Gemini model names such as
``gemini-3-flash-preview``, not ``model``) are off; chat compression would only start past half of
the CLI's 1,048,576-token limit for an unknown model.

The shell tool is ``run_shell_command`` (``bash -c <command>``; required ``command``, optional
``description``, ``dir_path``, ``is_background``, ``delay_ms``); its ``functionResponse`` is
``{"output": "<untrusted_context>\\nOutput: ...\\nProcess Group PGID: N\\n</untrusted_context>"}``.
A call of a tool the CLI does not offer (``get_weather``) is answered with
``{"error": "Tool \\"get_weather\\" not found. Did you mean one of: ..."}`` and the session goes on.
History the CLI sends back: ``thought`` parts dropped, consecutive text parts of a turn merged into
one, a ``functionCall`` kept with the server's ``id`` (else the CLI invents
``<name>_<epoch ms>_<n>``) and ``thoughtSignature`` (else ``"skip_thought_signature_validator"``).

The run
-------

``node <entry> --prompt=<prompt> --approval-mode yolo -m <model> --output-format stream-json`` in
``workdir``, with a fresh throw-away HOME (``.gemini/settings.json`` written from
``gemini_settings``; system settings paths pointed into it), XDG dirs and TMPDIR; an environment
built from scratch (no inherited ``GEMINI_*``/``GOOGLE_*``, proxy or cloud variables); the key in
``GEMINI_API_KEY``; ``GEMINI_CLI_NO_RELAUNCH`` (one node process, not a re-spawned child). YOLO
approval runs every tool without asking (folder trust off, else an untrusted workdir silently
downgrades YOLO); works as root. The CLI runs under ``compose.procs.headless``'s subreaper, which
kills whatever its tools left running when it exits or at the timeout. The CLI retries 429/5xx
and broken streams itself (``general.maxAttempts``, 5-30 s backoff): ``timeout`` bounds all of it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compose.harnesses.gemini_cli.install import ensure_gemini_cli, node_executable
from compose.procs.headless import base_env, json_events, prepare_home, run_headless, run_home, tail, with_overrides

#: The stand-in policy server's served model name; a vLLM behind the interceptor serves whatever
#: ``--served-model-name`` says: pass ``model=``.
DEFAULT_MODEL = "tokentrail-policy"
DUMMY_API_KEY = "tokentrail-offline-key"

#: ``$HOME/.gemini/settings.json``: API-key auth against GOOGLE_GEMINI_BASE_URL, and everything that
#: would reach anything but the model API, or ask, or call another model, switched off.
OFFLINE_SETTINGS: dict[str, Any] = {
    # Without a selected type, GOOGLE_GEMINI_BASE_URL selects "gateway" auth, which -p refuses (exit 41).
    "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
    "privacy": {"usageStatisticsEnabled": False},  # Clearcut logging; the privileged-user-id header
    "telemetry": {"enabled": False, "logPrompts": False},
    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False,
                "checkpointing": {"enabled": False}},
    "ide": {"enabled": False},
    "model": {"skipNextSpeakerCheck": True, "disableLoopDetection": True},
    # Tools that fetch from the internet themselves (tools.exclude: deprecated, still honoured in 0.61.0).
    "tools": {"exclude": ["web_fetch", "google_web_search"]},
    "skills": {"enabled": False},
    "experimental": {"enableAgents": False},
    "hooksConfig": {"enabled": False},
}


@dataclass
class GeminiCliResult:
    returncode: int | None  # None: killed at the timeout
    timed_out: bool
    events: list[dict[str, Any]]  # every stream-json event, in order
    stdout_tail: str
    stderr_tail: str
    argv: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)  # the settings.json the run used

    @property
    def result(self) -> dict[str, Any] | None:
        """The final ``{"type": "result", "status": ..., "stats": ...}`` event."""
        return next((e for e in reversed(self.events) if e.get("type") == "result"), None)

    @property
    def ok(self) -> bool:
        return (self.returncode == 0 and not self.timed_out and self.result is not None
                and self.result.get("status") == "success")

    @property
    def session_id(self) -> str | None:
        return next((e.get("session_id") for e in self.events if e.get("type") == "init"), None)

    def tool_uses(self) -> list[dict[str, Any]]:
        """``tool_use`` events: ``tool_name``, ``tool_id``, ``parameters``."""
        return [e for e in self.events if e.get("type") == "tool_use"]

    def tool_results(self) -> list[dict[str, Any]]:
        """``tool_result`` events: ``tool_id``, ``status`` (success | error), ``output``, ``error``."""
        return [e for e in self.events if e.get("type") == "tool_result"]

    def errors(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("type") == "error"]

    @property
    def final_text(self) -> str | None:
        """The assistant's text after its last tool call (the streamed deltas joined); None if none."""
        last_tool = max((i for i, e in enumerate(self.events) if e.get("type") in ("tool_use", "tool_result")),
                        default=-1)
        pieces = [e.get("content") or "" for e in self.events[last_tool + 1:]
                  if e.get("type") == "message" and e.get("role") == "assistant"]
        return "".join(pieces) or None


def merge(base: dict[str, Any], overrides: dict[str, Any] | None) -> dict[str, Any]:
    """``base`` deep-merged with ``overrides`` (a copy): dicts merge, other values replace, ``None`` removes."""
    out = copy.deepcopy(base)
    for key, value in (overrides or {}).items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def gemini_settings(overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The settings.json of one run: ``OFFLINE_SETTINGS`` deep-merged with ``overrides``."""
    return merge(OFFLINE_SETTINGS, overrides)


def gemini_env(base_url: str, home: Path, *, api_key: str = DUMMY_API_KEY,
               extra: dict[str, str | None] | None = None) -> dict[str, str]:
    """The complete environment for one run (nothing is inherited but PATH and locale).

    ``extra`` overrides entries; a ``None`` value removes one.
    """
    env = {
        **base_env(home),
        "GOOGLE_GEMINI_BASE_URL": base_url.rstrip("/"),
        "GEMINI_API_KEY": api_key,
        "GEMINI_API_KEY_AUTH_MECHANISM": "bearer",  # Authorization: Bearer <key> beside x-goog-api-key
        "GEMINI_CLI_NO_RELAUNCH": "true",
        # A machine-wide /etc/gemini-cli/settings.json must not reach into a run.
        "GEMINI_CLI_SYSTEM_SETTINGS_PATH": str(home / ".gemini-system" / "settings.json"),
        "GEMINI_CLI_SYSTEM_DEFAULTS_PATH": str(home / ".gemini-system" / "system-defaults.json"),
        "NO_PROXY": "*",
        "NO_COLOR": "1",
    }
    return with_overrides(env, extra)


def gemini_argv(node: str, entry: Path | str, prompt: str, *, model: str,
                extra_args: list[str] | None = None) -> list[str]:
    # --prompt=<text>: a prompt that starts with "-" stays the prompt, not a flag.
    return [node, str(entry), f"--prompt={prompt}", "--approval-mode", "yolo", "-m", model,
            "--output-format", "stream-json", *(extra_args or [])]


def run_gemini_cli(
    base_url: str,
    prompt: str,
    *,
    workdir: Path,
    timeout: float = 120,
    model: str = DEFAULT_MODEL,
    api_key: str = DUMMY_API_KEY,
    settings: dict[str, Any] | None = None,
    env: dict[str, str | None] | None = None,
    extra_args: list[str] | None = None,
    entry: Path | None = None,
    node: str | None = None,
    home: Path | None = None,
    on_spawn: Callable[[int], None] | None = None,
) -> GeminiCliResult:
    """Run ``gemini --prompt=prompt`` headless against ``base_url``; never leaves a process behind.

    ``base_url`` is a Gemini API base URL without the version (the interceptor's
    ``http://host:port/ng-rollout/<rollout-id>/training-token-capture``); the CLI posts to
    ``{base_url}/v1beta/models/{model}:streamGenerateContent?alt=sse``. ``api_key`` is sent as
    ``x-goog-api-key`` and ``Authorization: Bearer`` (a rollout token goes here). ``workdir`` is
    the CLI's working directory (its tools act there). ``home`` defaults to a fresh temporary
    directory, removed afterwards. ``settings`` deep-merges into ``gemini_settings`` (``None``
    removes a key); ``env`` overrides ``gemini_env``. ``entry``/``node``: the CLI's entry script
    and Node.js (default: the pinned install, the PATH's ``node``, checked >= 20). At ``timeout``
    seconds the CLI and everything it started are killed and ``timed_out`` is set. ``on_spawn`` as
    in ``run_headless``.
    """
    script = entry or ensure_gemini_cli()
    node_bin = node_executable(node)
    run_settings = gemini_settings(settings)
    argv = gemini_argv(node_bin, script, prompt, model=model, extra_args=extra_args)
    with run_home(home, prefix="tokentrail-gemini-home-") as home_dir:
        prepare_home(home_dir, ".gemini", ".gemini-system")
        (home_dir / ".gemini" / "settings.json").write_text(json.dumps(run_settings, indent=2) + "\n")
        done = run_headless(argv, cwd=workdir, env=gemini_env(base_url, home_dir, api_key=api_key, extra=env),
                            timeout=timeout, on_spawn=on_spawn)
    return GeminiCliResult(done.returncode, done.timed_out, json_events(done.stdout), tail(done.stdout),
                           tail(done.stderr), argv, run_settings)
