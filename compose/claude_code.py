"""The real Claude Code CLI, pinned, installed repo-locally and run headless and offline.

ARCHITECTURE §7 drives the interceptor end to end with the Claude Code CLI from the npm
registry. This module makes that reproducible from a clean clone. It guarantees:

* One pin. ``CLAUDE_CODE_VERSION`` equals the version in ``compose/claude_code/package.json``
  and ``package-lock.json`` (the lockfile carries the registry's sha512 for the wrapper and for
  every platform binary); a unit test keeps the three in step.
* Install (``ensure_claude_code()`` or ``python -m compose.claude_code install``): ``npm ci
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
  ``nohup``, ``setsid`` and double forks included).
* ``RecordingAnthropicStub``: a stdlib HTTP server that speaks enough of the Messages API
  (SSE and JSON, thinking/text/tool_use blocks, errors, ``count_tokens``, ``models``) for the
  CLI to finish multi-turn tool-using sessions, records every request and answer, and is
  deterministic given a ``scripted`` responder; ``record_scenario``/``write_fixtures`` (``python
  -m compose.claude_code record-fixtures tests/fixtures/claude_code``) regenerate the sanitized
  request fixtures byte-for-byte.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import parse_qsl, urlsplit

CLAUDE_CODE_VERSION = "2.1.332"
CLAUDE_CODE_PACKAGE = "@anthropic-ai/claude-code"

PIN_DIR = Path(__file__).resolve().parent / "claude_code"
REPO_ROOT = Path(__file__).resolve().parent.parent
INSTALL_SUBDIR = Path(".tokentrail") / "claude-code"


class ClaudeCodeUnavailable(RuntimeError):
    """The CLI cannot be installed here (no npm, no registry, no binary for this platform)."""


# --------------------------------------------------------------------------- install


def platform_package() -> str:
    """The npm package holding the native binary for this machine, e.g. ``...-linux-x64``."""
    system = {"linux": "linux", "darwin": "darwin", "windows": "win32"}.get(platform.system().lower())
    machine = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(
        platform.machine().lower())
    if system is None or machine is None:
        raise ClaudeCodeUnavailable(
            f"Claude Code ships no native binary for {platform.system()} {platform.machine()}")
    suffix = f"{system}-{machine}"
    if system == "linux" and platform.libc_ver()[0] != "glibc":
        suffix += "-musl"
    return f"{CLAUDE_CODE_PACKAGE}-{suffix}"


def install_dir(root: Path | None = None) -> Path:
    return (root or REPO_ROOT) / INSTALL_SUBDIR


def binary_path(root: Path | None = None) -> Path:
    """Where the native executable lives once installed (it may not exist yet)."""
    name = "claude.exe" if platform.system() == "Windows" else "claude"
    return install_dir(root) / "node_modules" / platform_package() / name


def _pin_files() -> dict[str, str]:
    """package.json (+ package-lock.json when shipped) to install from."""
    files: dict[str, str] = {}
    manifest = PIN_DIR / "package.json"
    if manifest.is_file():
        files["package.json"] = manifest.read_text()
        lock = PIN_DIR / "package-lock.json"
        if lock.is_file():
            files["package-lock.json"] = lock.read_text()
    else:  # a wheel without the pin files: the constant is the pin
        files["package.json"] = json.dumps(
            {"name": "tokentrail-claude-code", "private": True,
             "dependencies": {CLAUDE_CODE_PACKAGE: CLAUDE_CODE_VERSION}}, indent=2) + "\n"
    return files


def _installed_version(target: Path) -> str | None:
    try:
        manifest = json.loads((target / "node_modules" / CLAUDE_CODE_PACKAGE / "package.json").read_text())
    except (OSError, ValueError):
        return None
    return manifest.get("version")


def ensure_claude_code(root: Path | None = None, *, timeout: float = 600) -> Path:
    """Install the pinned CLI into ``<root>/.tokentrail/claude-code`` if needed; return its binary.

    Idempotent: with the pinned version's binary already there, no process is started. Safe to
    call from concurrent processes (an flock serializes installs). Raises
    ``ClaudeCodeUnavailable`` (naming the fix) when npm is missing or the install fails.
    """
    target = install_dir(root)
    binary = binary_path(root)
    if binary.is_file() and _installed_version(target) == CLAUDE_CODE_VERSION:
        return binary
    npm = shutil.which("npm")
    if npm is None:
        raise ClaudeCodeUnavailable(
            "npm is not on PATH: install Node.js >= 18 (it brings npm), then run "
            "`python -m compose.claude_code install` (or copy compose/claude_code/package.json and "
            f"package-lock.json into {target} and run `npm ci --ignore-scripts` there)")
    target.mkdir(parents=True, exist_ok=True)
    with _install_lock(target):
        if binary.is_file() and _installed_version(target) == CLAUDE_CODE_VERSION:
            return binary  # another process installed it meanwhile
        return _npm_install(npm, target, binary, timeout)


def _npm_install(npm: str, target: Path, binary: Path, timeout: float) -> Path:
    files = _pin_files()
    for name in ("package.json", "package-lock.json"):
        if name in files:
            (target / name).write_text(files[name])
        else:
            (target / name).unlink(missing_ok=True)
    command = "ci" if "package-lock.json" in files else "install"
    # --ignore-scripts: the wrapper's postinstall only hard-links the native binary over its
    # bin/claude.exe placeholder; we run the binary from the platform package directly (so
    # node_modules/.bin/claude stays the placeholder that prints an error: don't use it).
    # --include=optional overrides an omit=optional in the user's npmrc (the binary *is* the
    # optional dependency). --engine-strict=false: the wrapper declares node>=22, which only
    # matters for its install.cjs. --prefer-offline: use npm's cache (integrity-checked
    # against the lockfile) without revalidating.
    argv = [npm, command, "--ignore-scripts", "--include=optional", "--engine-strict=false",
            "--prefer-offline", "--no-audit", "--no-fund", "--loglevel=error"]
    try:
        proc = subprocess.run(argv, cwd=target, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL,
                              env={**os.environ, "npm_config_update_notifier": "false"})
    except subprocess.TimeoutExpired as exc:
        raise ClaudeCodeUnavailable(
            f"`{' '.join(argv)}` in {target} timed out after {timeout}s; is the npm registry reachable?") from exc
    if proc.returncode != 0 or not binary.is_file():
        raise ClaudeCodeUnavailable(
            f"`npm {command}` of {CLAUDE_CODE_PACKAGE}@{CLAUDE_CODE_VERSION} in {target} "
            f"failed (exit {proc.returncode}; binary {'present' if binary.is_file() else 'missing'} "
            f"at {binary}); is the npm registry reachable?\n{_tail(proc.stdout + proc.stderr)}")
    return binary


@contextlib.contextmanager
def _install_lock(target: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # Windows: no lock
        yield
        return
    with open(target / ".install.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# --------------------------------------------------------------------------- run

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


def _tail(text: str, limit: int = 4000) -> str:
    return text if len(text) <= limit else "..." + text[-limit:]


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


@dataclass
class RecordedRequest:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any  # parsed JSON, or the raw text, or None
    raw: bytes = b""  # the body exactly as received
    status: int | None = None  # what the stub answered
    response: Any = None  # the JSON it answered with (for SSE: the message the events spell out)

    def as_dict(self) -> dict[str, Any]:
        return {"method": self.method, "path": self.path, "query": self.query,
                "headers": self.headers, "body": self.body, "status": self.status,
                "response": self.response}


Reply = dict[str, Any]
"""``{"content": [blocks], "stop_reason": str}``, or ``{"status": int, "error": {"type", "message"}}``
for an Anthropic error response. Blocks may be ``text``, ``tool_use`` or ``thinking`` (with
``signature``)."""
Responder = Callable[[dict[str, Any]], Reply]


def _tool_names(body: dict[str, Any]) -> set[str]:
    return {t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)}


def _assistant_turns(body: dict[str, Any]) -> int:
    return sum(1 for m in body.get("messages") or [] if m.get("role") == "assistant")


def scripted(replies: list[Reply], *, side_text: str = "tokentrail") -> Responder:
    """A deterministic model: the n-th reply for a request whose history holds n-1 assistant turns.

    Keyed on the conversation, not on a call counter, so a retried request gets the same reply.
    ``tool_use`` blocks without an ``id`` get ``toolu_tokentrail_<turn><block>``. Requests that
    offer no ``Bash`` tool (side calls, if the CLI ever makes them) get ``side_text``.
    """

    def respond(body: dict[str, Any]) -> Reply:
        if "Bash" not in _tool_names(body):
            return {"content": [{"type": "text", "text": side_text}], "stop_reason": "end_turn"}
        turn = _assistant_turns(body)
        reply = copy.deepcopy(replies[min(turn, len(replies) - 1)])
        for i, block in enumerate(reply.get("content") or []):
            if block.get("type") == "tool_use" and "id" not in block:
                block["id"] = f"toolu_tokentrail_{turn + 1:02d}{i:02d}"
        return reply

    return respond


def bash_tool_use(command: str, description: str = "Print tokentrail", *, first: str = "command",
                  pre: list[dict[str, Any]] | None = None) -> Reply:
    """A reply that calls the ``Bash`` tool; ``first="description"`` puts that key first in ``input``."""
    inp = {"command": command, "description": description}
    if first == "description":
        inp = {"description": description, "command": command}
    return {"content": [*(pre or []), {"type": "tool_use", "name": "Bash", "input": inp}],
            "stop_reason": "tool_use"}


def text_reply(text: str, *, pre: list[dict[str, Any]] | None = None) -> Reply:
    return {"content": [*(pre or []), {"type": "text", "text": text}], "stop_reason": "end_turn"}


def bash_then_text(command: str = "echo tokentrail", final: str = "Done: the command printed tokentrail.",
                   side_text: str = "tokentrail") -> Responder:
    """The two-turn script: ``Bash(command)`` first, ``final`` once the tool_result came back."""
    return scripted([bash_tool_use(command), text_reply(final)], side_text=side_text)


class RecordingAnthropicStub:
    """An Anthropic Messages API stand-in on 127.0.0.1 that records every request.

    Answers ``POST /v1/messages`` (SSE when ``stream`` is true, JSON otherwise) from a
    ``Responder``, ``POST /v1/messages/count_tokens`` with a character-based estimate,
    ``GET /v1/models[/id]`` with the requested model; anything else gets an Anthropic-style 404
    (and is recorded). Use as a context manager; ``base_url`` has no trailing ``/v1``.
    """

    def __init__(self, responder: Responder | None = None, *, host: str = "127.0.0.1", port: int = 0):
        self.responder = responder or bash_then_text()
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                stub._handle(self)

            def do_POST(self) -> None:
                stub._handle(self)

            def do_HEAD(self) -> None:
                stub._handle(self)

            def do_PUT(self) -> None:
                stub._handle(self)

            def do_DELETE(self) -> None:
                stub._handle(self)

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> "RecordingAnthropicStub":
        self._thread = threading.Thread(target=self._server.serve_forever, name="anthropic-stub", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def messages_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.method == "POST" and r.path.rstrip("/").endswith("/v1/messages")]

    # -- request handling

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        split = urlsplit(h.path)
        length = int(h.headers.get("content-length") or 0)
        raw = h.rfile.read(length) if length else b""
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw.decode("utf-8", "replace")
        record = RecordedRequest(h.command, split.path, dict(parse_qsl(split.query, keep_blank_values=True)),
                                 {k.lower(): v for k, v in h.headers.items()}, body, raw)
        with self._lock:
            self.requests.append(record)
        path = split.path.rstrip("/")
        status, payload, sse = self._answer(h.command, path, split.path, body, raw)
        record.status, record.response = status, payload
        try:
            if sse:
                self._sse(h, payload)
            else:
                self._json(h, status, payload)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (e.g. killed)
            h.close_connection = True

    def _answer(self, method: str, path: str, full_path: str, body: Any, raw: bytes) -> tuple[int, Any, bool]:
        if method == "POST" and path.endswith("/v1/messages/count_tokens"):
            return 200, {"input_tokens": max(1, len(raw) // 4)}, False
        if method == "POST" and path.endswith("/v1/messages") and isinstance(body, dict):
            reply = self.responder(copy.deepcopy(body))
            if "status" in reply:
                return reply["status"], {"type": "error", "error": reply["error"]}, False
            message = self._message(body, reply)
            return 200, message, bool(body.get("stream"))
        if method == "GET" and "/v1/models" in path:
            model_id = path.split("/v1/models", 1)[1].strip("/") or "claude-stub"
            entry = {"type": "model", "id": model_id, "display_name": model_id,
                     "created_at": "2025-01-01T00:00:00Z"}
            if path.endswith("/v1/models"):
                return 200, {"data": [entry], "has_more": False, "first_id": model_id, "last_id": model_id}, False
            return 200, entry, False
        if method == "HEAD":
            return 200, {}, False
        return 404, {"type": "error", "error": {"type": "not_found_error",
                                                "message": f"stub: no {method} {full_path}"}}, False

    @staticmethod
    def _message(body: dict[str, Any], reply: Reply) -> dict[str, Any]:
        prompt_chars = len(json.dumps(body.get("messages", []))) + len(json.dumps(body.get("system", "")))
        return {
            "id": f"msg_tokentrail_{_assistant_turns(body) + 1:02d}", "type": "message", "role": "assistant",
            "model": body.get("model", "claude-stub"), "content": reply["content"],
            "stop_reason": reply.get("stop_reason", "end_turn"), "stop_sequence": None,
            "usage": {"input_tokens": max(1, prompt_chars // 4), "output_tokens": 8,
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
        }

    @staticmethod
    def _json(h: BaseHTTPRequestHandler, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        h.send_response(status)
        h.send_header("content-type", "application/json")
        h.send_header("request-id", f"req_{uuid.uuid4().hex[:24]}")
        h.send_header("content-length", str(len(data)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(data)

    @staticmethod
    def _sse(h: BaseHTTPRequestHandler, message: dict[str, Any]) -> None:
        events: list[tuple[str, dict[str, Any]]] = []
        start = {**message, "content": [], "stop_reason": None,
                 "usage": {**message["usage"], "output_tokens": 1}}
        events.append(("message_start", {"type": "message_start", "message": start}))
        for i, block in enumerate(message["content"]):
            if block["type"] == "text":
                events.append(("content_block_start", {"type": "content_block_start", "index": i,
                                                       "content_block": {"type": "text", "text": ""}}))
                events.append(("content_block_delta", {"type": "content_block_delta", "index": i,
                                                       "delta": {"type": "text_delta", "text": block["text"]}}))
            elif block["type"] == "tool_use":
                events.append(("content_block_start", {"type": "content_block_start", "index": i,
                                                       "content_block": {**block, "input": {}}}))
                events.append(("content_block_delta", {"type": "content_block_delta", "index": i,
                                                       "delta": {"type": "input_json_delta",
                                                                 "partial_json": json.dumps(block["input"])}}))
            elif block["type"] == "thinking":
                events.append(("content_block_start", {"type": "content_block_start", "index": i,
                                                       "content_block": {"type": "thinking", "thinking": "",
                                                                         "signature": ""}}))
                events.append(("content_block_delta", {"type": "content_block_delta", "index": i,
                                                       "delta": {"type": "thinking_delta",
                                                                 "thinking": block["thinking"]}}))
                events.append(("content_block_delta", {"type": "content_block_delta", "index": i,
                                                       "delta": {"type": "signature_delta",
                                                                 "signature": block["signature"]}}))
            else:
                raise ValueError(f"stub cannot stream a {block['type']!r} block")
            events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
        events.append(("message_delta", {"type": "message_delta",
                                         "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                                         "usage": {"output_tokens": message["usage"]["output_tokens"]}}))
        events.append(("message_stop", {"type": "message_stop"}))
        data = "".join(f"event: {name}\ndata: {json.dumps(payload)}\n\n" for name, payload in events).encode()
        h.send_response(200)
        h.send_header("content-type", "text/event-stream")
        h.send_header("cache-control", "no-cache")
        h.send_header("request-id", f"req_{uuid.uuid4().hex[:24]}")
        h.send_header("content-length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)


# --------------------------------------------------------------------------- fixtures

FIXTURE_PROMPT = "Run `echo tokentrail` with the Bash tool and tell me what it printed."
FIXTURE_ALLOWED_TOOLS = ["Bash(echo:*)"]
FIXTURE_FINAL = "Done: the command printed tokentrail."
SANITIZED_HOME = "/home/tokentrail"
SANITIZED_WORKDIR = "/work/rollout"
SANITIZED_SESSION_ID = "00000000-0000-4000-8000-000000000000"
SANITIZED_DEVICE_ID = "0" * 64
SANITIZED_DATE = "2026-01-01"
SANITIZED_OS_VERSION = "Linux 6.0.0"
SANITIZED_HOST = "127.0.0.1:8080"


def _thinking(text: str, n: int) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text, "signature": f"sig-tokentrail-{n:02d}"}


#: name -> (model or None for the CLI's default, scripted replies). Every scenario runs
#: FIXTURE_PROMPT with FIXTURE_ALLOWED_TOOLS.
SCENARIOS: dict[str, tuple[str | None, list[Reply]]] = {
    # The canonical rollout: Bash(echo tokentrail) -> tool_result -> final text.
    "bash_two_turn": (None, [bash_tool_use("echo tokentrail"), text_reply(FIXTURE_FINAL)]),
    # Thinking blocks (echoed with their signatures), text before a tool call, two tool calls,
    # and a tool input whose keys the model emitted out of schema order (the CLI reorders them).
    "thinking_two_tools": (None, [
        bash_tool_use("echo one", "Print one", pre=[_thinking("I should run echo one first.", 1)]),
        bash_tool_use("echo two", "Print two", first="description",
                      pre=[_thinking("Now echo two.", 2), {"type": "text", "text": "Running the second one."}]),
        text_reply("Both commands ran: one, two.", pre=[_thinking("Both done.", 3)]),
    ]),
    # A model name the CLI does not know (what a policy server is called): other max_tokens,
    # no per-turn output_config, fewer betas.
    "custom_model": ("tokentrail-policy", [bash_tool_use("echo tokentrail"), text_reply(FIXTURE_FINAL)]),
}


def _slug(path: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "-", path)


class Sanitizer:
    """Replaces what differs between runs and machines with fixed stand-ins (see SANITIZED_*)."""

    def __init__(self, *, workdir: Path, home: Path, session_id: str | None):
        self.pairs: list[tuple[str, str]] = []
        for real, fake in ((home, SANITIZED_HOME), (workdir, SANITIZED_WORKDIR)):
            for form in {str(real), str(real.resolve())}:
                self.pairs.append((form, fake))
                self.pairs.append((_slug(form), _slug(fake)))
        if session_id:
            self.pairs.append((session_id, SANITIZED_SESSION_ID))
        self.pairs.sort(key=lambda p: -len(p[0]))  # longest first: home before its parent dirs

    def text(self, s: str) -> str:
        for real, fake in self.pairs:
            s = s.replace(real, fake)
        s = re.sub(r'("device_id":")[0-9a-f]{64}(")', rf"\g<1>{SANITIZED_DEVICE_ID}\g<2>", s)
        s = re.sub(r"(Today's date is )\d{4}-\d{2}-\d{2}", rf"\g<1>{SANITIZED_DATE}", s)
        s = re.sub(r"(OS Version: )[^\n]*", rf"\g<1>{SANITIZED_OS_VERSION}", s)
        return s

    def value(self, v: Any) -> Any:
        if isinstance(v, str):
            return self.text(v)
        if isinstance(v, list):
            return [self.value(x) for x in v]
        if isinstance(v, dict):
            return {k: self.value(x) for k, x in v.items()}
        return v

    def request(self, r: RecordedRequest) -> dict[str, Any]:
        out = self.value(r.as_dict())
        headers = out["headers"]
        if "host" in headers:
            headers["host"] = SANITIZED_HOST
        if "content-length" in headers and isinstance(out["body"], dict):
            headers["content-length"] = str(len(compact_json(out["body"])))
        return out


def compact_json(body: Any) -> bytes:
    """The body as the CLI serializes it (JSON.stringify: no spaces, UTF-8, no ASCII escaping)."""
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass
class Recording:
    scenario: str
    model: str | None
    result: ClaudeCodeResult
    requests: list[dict[str, Any]]  # sanitized RecordedRequest.as_dict()s


def record_scenario(name: str, *, executable: Path | None = None, timeout: float = 120) -> Recording:
    """Run one of SCENARIOS with the real CLI against a RecordingAnthropicStub; sanitize it."""
    model, replies = SCENARIOS[name]
    with tempfile.TemporaryDirectory(prefix="tokentrail-cc-") as tmp:
        workdir, home = Path(tmp) / "rollout", Path(tmp) / "home"
        workdir.mkdir()
        home.mkdir()
        with RecordingAnthropicStub(scripted(replies)) as stub:
            result = run_claude_code(stub.base_url, FIXTURE_PROMPT, workdir=workdir, home=home,
                                     timeout=timeout, model=model, allowed_tools=FIXTURE_ALLOWED_TOOLS,
                                     executable=executable)
        sanitizer = Sanitizer(workdir=workdir, home=home, session_id=result.session_id)
        requests = [sanitizer.request(r) for r in stub.requests]
        result.result = sanitizer.value(result.result)
        result.events = sanitizer.value(result.events)
    return Recording(name, model, result, requests)


def write_fixtures(out_dir: Path, recordings: list[Recording]) -> dict[str, Any]:
    """One JSON file per request under ``out_dir/<scenario>/`` plus ``out_dir/index.json``."""
    index: dict[str, Any] = {
        "claude_code_version": CLAUDE_CODE_VERSION,
        "regenerate": "python -m compose.claude_code record-fixtures tests/fixtures/claude_code",
        "prompt": FIXTURE_PROMPT,
        "allowed_tools": FIXTURE_ALLOWED_TOOLS,
        "environment": "compose.claude_code.claude_code_env (offline, isolated HOME) plus "
                       "compose.claude_code.run_claude_code's flags",
        "sanitized": {"home": SANITIZED_HOME, "workdir": SANITIZED_WORKDIR,
                      "session_id": SANITIZED_SESSION_ID, "device_id": SANITIZED_DEVICE_ID,
                      "date": SANITIZED_DATE, "os_version": SANITIZED_OS_VERSION, "host": SANITIZED_HOST,
                      "content_length": "recomputed from the sanitized body (compact_json)"},
        "body_bytes": "the CLI sends compact_json(body) exactly: JSON.stringify, no spaces, UTF-8",
        "scenarios": {},
    }
    for rec in recordings:
        sdir = out_dir / rec.scenario
        if sdir.exists():
            shutil.rmtree(sdir)
        sdir.mkdir(parents=True)
        files = []
        for i, req in enumerate(rec.requests):
            fname = f"{i:02d}_{req['method'].lower()}{re.sub(r'[^a-z0-9]+', '_', req['path'].lower())}.json"
            (sdir / fname).write_text(json.dumps(req, indent=1, ensure_ascii=False) + "\n")
            body = req["body"] if isinstance(req["body"], dict) else {}
            files.append({"file": f"{rec.scenario}/{fname}", "method": req["method"], "path": req["path"],
                          "query": req["query"], "model": body.get("model"), "stream": body.get("stream"),
                          "messages": len(body.get("messages") or []), "tools": len(body.get("tools") or []),
                          "body_bytes": len(compact_json(req["body"])), "status": req["status"]})
        res = rec.result.result or {}
        index["scenarios"][rec.scenario] = {
            "model": rec.model or "(CLI default)",
            "requests": files,
            "cli_result": {k: res.get(k) for k in ("subtype", "is_error", "num_turns", "result", "stop_reason")},
            "cli_tool_results": rec.result.tool_results(),
        }
    (out_dir / "index.json").write_text(json.dumps(index, indent=1, ensure_ascii=False) + "\n")
    return index


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m compose.claude_code", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("install", help="install the pinned CLI into .tokentrail/claude-code; print its path")
    rec = sub.add_parser("record-fixtures", help="run SCENARIOS against the recording stub; write fixtures")
    rec.add_argument("out_dir", type=Path)
    rec.add_argument("--scenario", action="append", choices=sorted(SCENARIOS))
    args = parser.parse_args(argv)
    binary = ensure_claude_code()
    if args.cmd == "install":
        print(binary)
        return 0
    recordings = []
    for name in args.scenario or list(SCENARIOS):
        recording = record_scenario(name, executable=binary)
        if not recording.result.ok:
            print(f"{name}: the CLI failed: {recording.result.stderr_tail}", file=sys.stderr)
            return 1
        recordings.append(recording)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    write_fixtures(args.out_dir, recordings)
    print(f"wrote {sum(len(r.requests) for r in recordings)} requests to {args.out_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
