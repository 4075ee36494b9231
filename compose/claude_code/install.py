"""Install the pinned Claude Code CLI repo-locally (npm), without running its install scripts."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Iterator


CLAUDE_CODE_VERSION = "2.1.332"
CLAUDE_CODE_PACKAGE = "@anthropic-ai/claude-code"

PIN_DIR = Path(__file__).resolve().parent  # package.json and package-lock.json live beside this module
REPO_ROOT = Path(__file__).resolve().parents[2]
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

def _tail(text: str, limit: int = 4000) -> str:
    return text if len(text) <= limit else "..." + text[-limit:]
