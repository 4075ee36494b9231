"""Run the Claude Code CLI headless and offline against one base URL; no process outlives a run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compose.harnesses.claude_code.install import ensure_claude_code
from compose.procs.headless import base_env, json_events, prepare_home, run_headless, run_home, tail, with_overrides
from schemas.errors import TokentrailError

#: Environment that keeps the CLI offline and quiet, apart from the model API itself.
OFFLINE_ENV: dict[str, str] = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_BUG_COMMAND": "1",
    "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
    "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1",
    "CLAUDE_CODE_IDE_SKIP_AUTO_INSTALL": "1",
    "NO_UPDATE_NOTIFIER": "1",
}


class ClaudeCodeUsageError(TokentrailError, ValueError):
    """``run_claude_code`` was asked for something its arguments cannot give."""


@dataclass
class ClaudeCodeResult:
    returncode: int | None  # None: killed at the timeout
    timed_out: bool
    result: dict[str, Any] | None  # the final {"type": "result", ...} event
    events: list[dict[str, Any]]  # every stream-json event, in order
    stdout_tail: str
    stderr_tail: str
    argv: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (self.returncode == 0 and self.result is not None
                and not self.result.get("is_error", False))

    @property
    def final_text(self) -> str | None:
        return None if self.result is None else self.result.get("result")

    @property
    def session_id(self) -> str | None:
        return None if self.result is None else self.result.get("session_id")

    @property
    def num_turns(self) -> int | None:
        return None if self.result is None else self.result.get("num_turns")

    def tool_results(self) -> list[dict[str, Any]]:
        """The ``tool_result`` blocks the CLI fed back to the model, as it reported them."""
        out: list[dict[str, Any]] = []
        for event in self.events:
            if event.get("type") != "user":
                continue
            content = (event.get("message") or {}).get("content")
            if isinstance(content, list):
                out.extend(b for b in content if isinstance(b, dict) and b.get("type") == "tool_result")
        return out


def claude_code_env(base_url: str, home: Path, *, model: str | None = None,
                    extra: dict[str, str | None] | None = None) -> dict[str, str]:
    """The complete environment for one run (nothing is inherited but PATH and locale).

    ``extra`` overrides entries; a ``None`` value removes one.
    """
    env = {
        **base_env(home),
        "CLAUDE_CONFIG_DIR": str(home / ".claude"),
        "ANTHROPIC_BASE_URL": base_url.rstrip("/"),
        "ANTHROPIC_API_KEY": "sk-ant-tokentrail-offline",
        "NO_PROXY": "*",
        **OFFLINE_ENV,
    }
    if model is not None:
        env["ANTHROPIC_MODEL"] = model
        env["ANTHROPIC_SMALL_FAST_MODEL"] = model
        env["ANTHROPIC_DEFAULT_HAIKU_MODEL"] = model
        env["ANTHROPIC_DEFAULT_SONNET_MODEL"] = model
        env["ANTHROPIC_DEFAULT_OPUS_MODEL"] = model
    return with_overrides(env, extra)


def run_claude_code(
    base_url: str,
    prompt: str,
    *,
    workdir: Path,
    timeout: float = 120,
    model: str | None = None,
    env: dict[str, str | None] | None = None,
    allowed_tools: list[str] | None = None,
    extra_args: list[str] | None = None,
    executable: Path | None = None,
    home: Path | None = None,
    on_spawn: Callable[[int], None] | None = None,
    persist_session: bool = False,
    resume: str | None = None,
) -> ClaudeCodeResult:
    """Run ``claude -p prompt`` headless against ``base_url``; never leaves a process behind.

    ``workdir`` is the CLI's working directory (its tools act there). ``home`` defaults to a
    fresh temporary directory, removed afterwards. ``model`` is passed as ``--model`` and as every
    ``ANTHROPIC_*_MODEL`` variable, so any side call would use it too. ``allowed_tools`` are
    ``--allowedTools`` rules (``"Bash(echo:*)"``, ``"Bash"``); read-only commands such as ``echo``
    run without one, commands that write need one. ``env`` entries override (``None``: remove)
    those of ``claude_code_env``. At ``timeout`` seconds the CLI and everything it started are
    killed and ``timed_out`` is set. ``on_spawn`` as in ``run_headless``.

    By default no session is saved. ``persist_session`` saves it under ``home``'s
    ``.claude`` (drops ``--no-session-persistence``); ``resume`` continues the saved session
    with that id (``--resume``), which needs the same ``home`` and ``workdir`` as the run that
    saved it, and ``persist_session`` again if a later run resumes it further (``/compact``
    then a new prompt).
    """
    if (persist_session or resume is not None) and home is None:
        raise ClaudeCodeUsageError(
            f"run_claude_code(persist_session={persist_session!r}, resume={resume!r}) needs home=: "
            "the default temporary home, where the session is saved, is removed after the run; "
            "pass the same home directory to every run of the session")
    binary = executable or ensure_claude_code()
    argv = [str(binary), "-p", "--output-format", "stream-json", "--verbose",
            *([] if persist_session else ["--no-session-persistence"]),
            "--strict-mcp-config", "--setting-sources", ""]
    if resume is not None:
        argv += ["--resume", resume]
    if model is not None:
        argv += ["--model", model]
    if allowed_tools:
        argv += ["--allowedTools", ",".join(allowed_tools)]
    argv += list(extra_args or [])
    argv += ["--", prompt]
    with run_home(home, prefix="tokentrail-claude-home-") as home_dir:
        prepare_home(home_dir, ".claude")
        done = run_headless(argv, cwd=workdir, env=claude_code_env(base_url, home_dir, model=model, extra=env),
                            timeout=timeout, on_spawn=on_spawn)
    events = json_events(done.stdout)
    result = next((e for e in reversed(events) if e.get("type") == "result"), None)
    return ClaudeCodeResult(done.returncode, done.timed_out, result, events,
                            tail(done.stdout), tail(done.stderr), argv)
