"""Run ``codex exec`` non-interactively and offline against one base URL; no process outlives a run.

What the CLI sends (``@openai/codex`` 0.171.0, with the config this module writes)
--------------------------------------------------------------------------------

One ``POST {base_url}/responses`` per model turn (OpenAI Responses API, ``stream: true``,
``store: false``, ``tool_choice: "auto"``, ``parallel_tool_calls: true``, ``reasoning:
{"summary": "auto"}``, ``include: ["reasoning.encrypted_content"]``, the full ``input`` every
time: developer messages (~40 KB of instructions and skills), an ``<environment_context>`` user
message, the prompt, then ``function_call`` / ``function_call_output`` items). Nothing else:
no ``/models``, no login, no update check, no analytics, no plugin sync (see ``OFFLINE_CONFIG``).
Headers: ``authorization: Bearer <dummy key>``, ``originator: codex_exec``, ``session-id``,
``x-codex-turn-metadata`` (ids, sandbox, ``"analytics_enabled": false``).

The shell tool Codex offers by default ("unified exec") is the *first* entry of ``tools``::

    {"type": "function", "name": "exec_command", "strict": false,
     "description": "Runs a command in a PTY, returning output or a session ID for ongoing interaction.",
     "parameters": {"type": "object", "additionalProperties": false, "required": ["cmd"],
                    "properties": {"cmd": {"type": "string"},           # the shell command line
                                   "workdir": {"type": "string"}, "shell": {"type": "string"},
                                   "login": {"type": "boolean"}, "tty": {"type": "boolean"},
                                   "yield_time_ms": {"type": "number"},
                                   "max_output_tokens": {"type": "number"},
                                   "sandbox_permissions": {"type": "string",
                                                           "enum": ["use_default", "require_escalated"]},
                                   "justification": {"type": "string"},
                                   "prefix_rule": {"type": "array", "items": {"type": "string"}}}}}

so a model calls it with a ``function_call`` item ``{"type": "function_call", "name":
"exec_command", "call_id": "...", "arguments": "{\\"cmd\\": \\"echo tokentrail\\"}"}``; the CLI
runs ``$SHELL -lc '<cmd>'`` (``/bin/bash`` here) in ``workdir`` and answers with a
``function_call_output`` whose ``output`` is one text block (``Chunk ID: ...``, ``Wall time:
...``, ``Process exited with code N``, ``Original token count: N``, ``Output:`` and the output).

The other tools offered: ``write_stdin`` ({"session_id": number, "chars": string}, for a
command still running after ``yield_time_ms``), ``request_user_input``, ``view_image``
({"path"}), a ``namespace`` tool ``multi_agent_v1`` (spawn/send/close agents),
``get_goal``/``create_goal``/``update_goal``. A call of a tool the CLI did not offer (say
``shell`` with ``{"command": [...]}``, the shell tool of older Codex versions) is answered with
the ``function_call_output`` ``"unsupported call: shell"``; ``[features] unified_exec = false``
does not bring that tool back in 0.171.0.

That is the tool set for a model name the CLI has no metadata for (``tokentrail-policy``, any
open model: "fallback metadata", reported as an ``error`` item). For a name in its built-in
catalog (``gpt-5.5``) it differs: ``exec_command`` is still first, ``apply_patch`` comes as a
``custom`` (Lark-grammar, freeform) tool and ``tool_search`` as a hosted one, ``multi_agent_v1``
goes, and the request adds ``reasoning: {"effort": "medium"}`` and ``text: {"verbosity": "low"}``.

The run
-------

``codex exec --json`` with a fresh throw-away HOME, ``CODEX_HOME`` (holding the generated
``config.toml``), XDG dirs and TMPDIR; an environment built from scratch (no inherited
``OPENAI_*``, proxy or ``CODEX_*`` variables); the dummy key in ``TOKENTRAIL_CODEX_API_KEY``
(the provider's ``env_key``); approvals ``never`` and sandbox ``danger-full-access`` (tools run
without asking and without bwrap/landlock, which containers often lack; works as root);
``--ephemeral`` (no session files), ``--ignore-rules``, ``--skip-git-repo-check``,
``--strict-config`` (a key this CLI version does not know is an error, not silently ignored).
The CLI runs under a small subreaper parent that, when the CLI exits or at the timeout, kills
everything the CLI's tools left running (PTY sessions, background jobs, ``setsid`` and double
forks included).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compose.harnesses.codex.install import ensure_codex
from compose.procs.headless import base_env, json_events, prepare_home, run_headless, run_home, tail, with_overrides

#: The stand-in policy server's served model name (``compose/engines/policy/settings.py``); a vLLM
#: behind the interceptor serves whatever ``--served-model-name`` says: pass ``model=``.
DEFAULT_MODEL = "tokentrail-policy"
PROVIDER_ID = "tokentrail"
API_KEY_ENV = "TOKENTRAIL_CODEX_API_KEY"
DUMMY_API_KEY = "sk-tokentrail-offline"

#: Everything that would reach anything but the model API, switched off (checked on 0.171.0
#: behind a recording proxy: without these the CLI contacts github.com, api.github.com and
#: chatgpt.com for the curated plugin sync, and reports analytics).
OFFLINE_CONFIG: dict[str, Any] = {
    "check_for_update_on_startup": False,
    "web_search": "disabled",  # the hosted web_search tool (never reaches a local model anyway)
    "analytics": {"enabled": False},
    "feedback": {"enabled": False},
    "otel": {"exporter": "none", "trace_exporter": "none", "metrics_exporter": "none",
             "log_user_prompt": False},
    "history": {"persistence": "none"},
    "features": {"plugins": False, "remote_plugin": False, "plugin_sharing": False, "apps": False,
                 "tool_suggest": False, "image_generation": False},
}


@dataclass
class CodexResult:
    returncode: int | None  # None: killed at the timeout
    timed_out: bool
    events: list[dict[str, Any]]  # every --json event, in order
    stdout_tail: str
    stderr_tail: str
    argv: list[str] = field(default_factory=list)
    config_toml: str = ""  # the config.toml the run used

    @property
    def completed(self) -> bool:
        """The turn ran to its end (a ``turn.completed`` event and no ``turn.failed``)."""
        types = [e.get("type") for e in self.events]
        return "turn.completed" in types and "turn.failed" not in types

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and self.completed

    @property
    def thread_id(self) -> str | None:
        return next((e.get("thread_id") for e in self.events if e.get("type") == "thread.started"), None)

    @property
    def usage(self) -> dict[str, Any] | None:
        """``usage`` of the last ``turn.completed`` (input, cached input, output tokens)."""
        return next((e.get("usage") for e in reversed(self.events) if e.get("type") == "turn.completed"), None)

    def items(self, kind: str | None = None) -> list[dict[str, Any]]:
        """Completed items (``item.completed``), optionally of one ``type``: ``agent_message``,
        ``command_execution``, ``reasoning``, ``file_change``, ``mcp_tool_call``, ``error``, ..."""
        out = []
        for event in self.events:
            item = event.get("item")
            if event.get("type") == "item.completed" and isinstance(item, dict):
                if kind is None or item.get("type") == kind:
                    out.append(item)
        return out

    @property
    def final_text(self) -> str | None:
        """The text of the last agent message (what ``codex exec`` prints as its answer)."""
        messages = self.items("agent_message")
        return messages[-1].get("text") if messages else None

    def tool_calls(self) -> list[dict[str, Any]]:
        """The shell commands the CLI ran for the model, as it reported them: ``command`` (e.g.
        ``/bin/bash -lc 'echo tokentrail'``), ``aggregated_output``, ``exit_code``, ``status``
        (``completed`` | ``failed`` | ``declined``)."""
        return self.items("command_execution")

    def errors(self) -> list[str]:
        """Error messages: ``error`` events, ``turn.failed`` and ``error`` items (the CLI reports
        a model it has no metadata for, such as ``tokentrail-policy``, as a harmless error item)."""
        out = []
        for event in self.events:
            kind = event.get("type")
            if kind == "error":
                out.append(str(event.get("message")))
            elif kind == "turn.failed":
                out.append(str((event.get("error") or {}).get("message")))
        out.extend(str(item.get("message")) for item in self.items("error"))
        return out


def parse_events(stdout: str) -> list[dict[str, Any]]:
    """The JSON objects of ``codex exec --json`` output (one per line; other lines skipped)."""
    return json_events(stdout)


# --------------------------------------------------------------------------- config


def codex_config(base_url: str, *, model: str = DEFAULT_MODEL,
                 overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``config.toml`` of one run, as a dict: a custom Responses provider at ``base_url``,
    no approvals, no sandbox, ``OFFLINE_CONFIG``. ``overrides`` is merged in table by table;
    a ``None`` value removes a key (``{"features": {"goals": False}}``, ``{"web_search": None}``)."""
    config: dict[str, Any] = {
        "model": model,
        "model_provider": PROVIDER_ID,
        "approval_policy": "never",
        "sandbox_mode": "danger-full-access",
        **copy.deepcopy(OFFLINE_CONFIG),
        "model_providers": {PROVIDER_ID: {
            "name": "tokentrail interceptor",
            "base_url": base_url.rstrip("/"),
            "wire_api": "responses",
            "env_key": API_KEY_ENV,
            # One request per model turn: a retried turn would be a second capture of it.
            "request_max_retries": 0,
            "stream_max_retries": 0,
        }},
    }
    _merge(config, overrides or {})
    return config


def _merge(into: dict[str, Any], extra: dict[str, Any]) -> None:
    for key, value in extra.items():
        if value is None:
            into.pop(key, None)
        elif isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def to_toml(config: dict[str, Any]) -> str:
    """A minimal TOML writer for str, bool, int, float, lists of those, and nested tables."""
    lines: list[str] = []
    _write_table(config, [], lines)
    return "\n".join(lines).strip() + "\n"


def _write_table(table: dict[str, Any], path: list[str], lines: list[str]) -> None:
    scalars = {k: v for k, v in table.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in table.items() if isinstance(v, dict)}
    if path and (scalars or not tables):
        lines.append("")
        lines.append("[" + ".".join(_key(p) for p in path) + "]")
    for key, value in scalars.items():
        lines.append(f"{_key(key)} = {_value(value)}")
    for key, value in tables.items():
        _write_table(value, [*path, key], lines)


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a TOML basic string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


# --------------------------------------------------------------------------- environment


def codex_env(home: Path, *, extra: dict[str, str | None] | None = None) -> dict[str, str]:
    """The complete environment for one run (nothing is inherited but PATH and locale).

    ``extra`` overrides entries; a ``None`` value removes one.
    """
    env = {
        # CODEX_HOME must not lie inside TMPDIR (base_env's TMPDIR is <home>/tmp): the CLI refuses
        # to create its helper binaries (the apply_patch alias on the tools' PATH) under the temp
        # dir, with a warning.
        **base_env(home),
        "CODEX_HOME": str(home / ".codex"),
        API_KEY_ENV: DUMMY_API_KEY,
        "NO_PROXY": "*",
        "NO_COLOR": "1",
    }
    return with_overrides(env, extra)


def _prepare_home(home: Path, config_toml: str) -> None:
    prepare_home(home, ".codex")
    (home / ".codex" / "config.toml").write_text(config_toml)


def codex_argv(binary: Path | str, prompt: str, *, workdir: Path, model: str | None = None,
               extra_args: list[str] | None = None) -> list[str]:
    argv = [str(binary), "exec", "--json", "--color", "never", "--skip-git-repo-check", "--ephemeral",
            "--ignore-rules", "--strict-config", "-C", str(workdir)]
    if model is not None:
        argv += ["--model", model]
    argv += list(extra_args or [])
    return [*argv, "--", prompt]


# --------------------------------------------------------------------------- run


def run_codex(
    base_url: str,
    prompt: str,
    *,
    workdir: Path,
    timeout: float = 120,
    model: str = DEFAULT_MODEL,
    config: dict[str, Any] | None = None,
    env: dict[str, str | None] | None = None,
    extra_args: list[str] | None = None,
    executable: Path | None = None,
    home: Path | None = None,
    on_spawn: Callable[[int], None] | None = None,
) -> CodexResult:
    """Run ``codex exec --json -- prompt`` against ``base_url``; never leaves a process behind.

    ``base_url`` is an OpenAI base URL ending in ``/v1`` (the interceptor's
    ``http://host:port/ng-rollout/<rollout-id>/training-token-capture/v1``); the CLI posts to
    ``{base_url}/responses``. ``workdir`` is the CLI's working root (its tools act there).
    ``home`` defaults to a fresh temporary directory, removed afterwards. ``model`` goes into the
    config and ``--model``. ``config`` overrides entries of ``codex_config`` (``None`` removes
    one); ``env`` those of ``codex_env``. At ``timeout`` seconds the CLI and everything it started
    are killed and ``timed_out`` is set. ``on_spawn`` as in ``run_headless``.
    """
    binary = executable or ensure_codex()
    config_toml = to_toml(codex_config(base_url, model=model, overrides=config))
    argv = codex_argv(binary, prompt, workdir=workdir, model=model, extra_args=extra_args)
    with run_home(home, prefix="tokentrail-codex-home-") as home_dir:
        _prepare_home(home_dir, config_toml)
        done = run_headless(argv, cwd=workdir, env=codex_env(home_dir, extra=env), timeout=timeout,
                            on_spawn=on_spawn)
    return CodexResult(done.returncode, done.timed_out, parse_events(done.stdout),
                       tail(done.stdout), tail(done.stderr), argv, config_toml)
