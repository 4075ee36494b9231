"""Run the Claude Code CLI headless and offline against one base URL; no process outlives a run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compose.claude_code.install import OFFLINE_ENV, _tail, ensure_claude_code




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
        out = []
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
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "HOME": str(home),
        "USER": os.environ.get("USER", "tokentrail"),
        "SHELL": shutil.which("bash") or "/bin/sh",
        "TERM": "dumb",
        "TMPDIR": str(home / "tmp"),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
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
    for key, value in (extra or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def _prepare_home(home: Path) -> None:
    for sub in ("tmp", ".config", ".cache", ".local/share", ".local/state", ".claude"):
        (home / sub).mkdir(parents=True, exist_ok=True)


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
) -> ClaudeCodeResult:
    """Run ``claude -p prompt`` headless against ``base_url``; never leaves a process behind.

    ``workdir`` is the CLI's working directory (its tools act there). ``home`` defaults to a
    fresh temporary directory, removed afterwards. ``model`` is passed as ``--model`` and as every
    ``ANTHROPIC_*_MODEL`` variable, so any side call would use it too. ``allowed_tools`` are
    ``--allowedTools`` rules (``"Bash(echo:*)"``, ``"Bash"``); read-only commands such as ``echo``
    run without one, commands that write need one. ``env`` entries override (``None``: remove)
    those of ``claude_code_env``. At ``timeout`` seconds the CLI and everything it started are
    killed and ``timed_out`` is set.
    """
    binary = executable or ensure_claude_code()
    argv = [str(binary), "-p", "--output-format", "stream-json", "--verbose",
            "--no-session-persistence", "--strict-mcp-config", "--setting-sources", ""]
    if model is not None:
        argv += ["--model", model]
    if allowed_tools:
        argv += ["--allowedTools", ",".join(allowed_tools)]
    argv += list(extra_args or [])
    argv += ["--", prompt]
    own_home = home is None
    home_dir = Path(tempfile.mkdtemp(prefix="tokentrail-claude-home-")) if own_home else home
    timed_out = False
    try:
        _prepare_home(home_dir)
        # The reaper (see _REAPER) is the CLI's parent: it outlives the CLI, adopts whatever the
        # CLI's tools left running (setsid and double forks included) and kills all of it.
        proc = subprocess.Popen(
            [sys.executable, "-c", _REAPER, *argv], cwd=workdir,
            env=claude_code_env(base_url, home_dir, model=model, extra=env),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.send_signal(signal.SIGTERM)  # the reaper kills the CLI and its descendants
            try:
                stdout, stderr = proc.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                _kill_group(proc.pid)
                stdout, stderr = proc.communicate()
        finally:
            if proc.poll() is None:
                _kill_group(proc.pid)
                proc.wait()
    finally:
        if own_home:
            shutil.rmtree(home_dir, ignore_errors=True)
    out = stdout.decode("utf-8", "replace")
    err = stderr.decode("utf-8", "replace")
    events: list[dict[str, Any]] = []
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except ValueError:
                pass
    result = next((e for e in reversed(events) if e.get("type") == "result"), None)
    return ClaudeCodeResult(None if timed_out else proc.returncode, timed_out, result, events,
                            _tail(out), _tail(err), argv)


# Runs as ``python -c _REAPER claude ...``: makes itself the child subreaper (Linux), runs the
# CLI, and once the CLI has exited (or on SIGTERM, after killing it) SIGKILLs every process that
# is still its child, over and over, until it has no children left; orphans of the CLI's tools
# are re-parented to it, so nothing started by the run survives it. Exits with the CLI's status.
_REAPER = r"""
import ctypes, os, signal, subprocess, sys, time
try:
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
except Exception:
    pass
cli = subprocess.Popen(sys.argv[1:])
signal.signal(signal.SIGTERM, lambda *_: cli.kill())
while True:
    try:
        rc = cli.wait()
        break
    except InterruptedError:
        continue
me = os.getpid()
while True:
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == me:
                try:
                    os.kill(int(entry), signal.SIGKILL)
                except OSError:
                    pass
    try:
        pid, _ = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        break
    if pid == 0:
        time.sleep(0.02)
sys.exit(rc if rc >= 0 else 128 - rc)
"""


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# --------------------------------------------------------------------------- recording stub


