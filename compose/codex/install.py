"""Install the pinned Codex CLI repo-locally (npm), without running any install script."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Iterator


CODEX_VERSION = "0.171.0"
CODEX_PACKAGE = "@openai/codex"

PIN_DIR = Path(__file__).resolve().parent  # package.json and package-lock.json live beside this module
REPO_ROOT = Path(__file__).resolve().parents[2]
INSTALL_SUBDIR = Path(".tokentrail") / "codex"

#: (os, machine) -> (npm platform suffix, Rust target triple of the binary the package ships).
#: The Linux binaries are static musl builds: they run on glibc and musl systems alike.
_TARGETS: dict[tuple[str, str], tuple[str, str]] = {
    ("linux", "x64"): ("linux-x64", "x86_64-unknown-linux-musl"),
    ("linux", "arm64"): ("linux-arm64", "aarch64-unknown-linux-musl"),
    ("darwin", "x64"): ("darwin-x64", "x86_64-apple-darwin"),
    ("darwin", "arm64"): ("darwin-arm64", "aarch64-apple-darwin"),
    ("win32", "x64"): ("win32-x64", "x86_64-pc-windows-msvc"),
    ("win32", "arm64"): ("win32-arm64", "aarch64-pc-windows-msvc"),
}


class CodexUnavailable(RuntimeError):
    """The CLI cannot be installed here (no npm, no registry, no binary for this platform)."""


# --------------------------------------------------------------------------- install


def _target() -> tuple[str, str]:
    system = {"linux": "linux", "darwin": "darwin", "windows": "win32"}.get(platform.system().lower())
    machine = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(
        platform.machine().lower())
    target = _TARGETS.get((system or "", machine or ""))
    if target is None:
        raise CodexUnavailable(f"Codex ships no native binary for {platform.system()} {platform.machine()}")
    return target


def platform_package() -> str:
    """The ``node_modules`` name of the package holding this machine's binary, e.g.
    ``@openai/codex-linux-x64`` (an npm alias of ``@openai/codex@<version>-linux-x64``)."""
    return f"{CODEX_PACKAGE}-{_target()[0]}"


def target_triple() -> str:
    return _target()[1]


def install_dir(root: Path | None = None) -> Path:
    return (root or REPO_ROOT) / INSTALL_SUBDIR


def vendor_dir(root: Path | None = None) -> Path:
    """``vendor/<triple>`` of the platform package: ``bin/codex``, ``codex-path/rg``, ``codex-resources``."""
    return install_dir(root) / "node_modules" / platform_package() / "vendor" / target_triple()


def binary_path(root: Path | None = None) -> Path:
    """Where the native executable lives once installed (it may not exist yet)."""
    name = "codex.exe" if platform.system() == "Windows" else "codex"
    return vendor_dir(root) / "bin" / name


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
            {"name": "tokentrail-codex", "private": True,
             "dependencies": {CODEX_PACKAGE: CODEX_VERSION}}, indent=2) + "\n"
    return files


def _version_of(package_dir: Path) -> str | None:
    try:
        return json.loads((package_dir / "package.json").read_text()).get("version")
    except (OSError, ValueError, AttributeError):
        return None


def installed_version(root: Path | None = None) -> str | None:
    """The installed CLI's version, when the wrapper and this platform's binary package agree."""
    modules = install_dir(root) / "node_modules"
    wrapper = _version_of(modules / CODEX_PACKAGE)
    native = _version_of(modules / platform_package())  # "<version>-<platform>"
    if wrapper is None or native != f"{wrapper}-{_target()[0]}":
        return None
    return wrapper


def _ready(root: Path | None) -> bool:
    return binary_path(root).is_file() and installed_version(root) == CODEX_VERSION


def ensure_codex(root: Path | None = None, *, timeout: float = 600) -> Path:
    """Install the pinned CLI into ``<root>/.tokentrail/codex`` if needed; return its binary.

    Idempotent: with the pinned version's binary already there, no process is started. Safe to
    call from concurrent processes (an flock serializes installs). Raises ``CodexUnavailable``
    (naming the fix) when npm is missing or the install fails.
    """
    binary = binary_path(root)
    if _ready(root):
        return binary
    npm = shutil.which("npm")
    if npm is None:
        raise CodexUnavailable(
            "npm is not on PATH: install Node.js >= 16 (it brings npm), then run "
            "`python -m compose.codex install` (or copy compose/codex/package.json and "
            f"package-lock.json into {install_dir(root)} and run `npm ci --ignore-scripts` there)")
    target = install_dir(root)
    target.mkdir(parents=True, exist_ok=True)
    with _install_lock(target):
        if _ready(root):
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
    # The wrapper @openai/codex has no install scripts; its optional dependency
    # @openai/codex-<platform> (an alias of @openai/codex@<version>-<platform>, from the npm
    # registry like the wrapper) carries the native binary under vendor/<triple>/bin/codex.
    # --ignore-scripts anyway (nothing may download from elsewhere); --include=optional overrides
    # an omit=optional in the user's npmrc (the binary *is* the optional dependency);
    # --prefer-offline uses npm's cache (integrity-checked against the lockfile).
    argv = [npm, command, "--ignore-scripts", "--include=optional", "--engine-strict=false",
            "--prefer-offline", "--no-audit", "--no-fund", "--loglevel=error"]
    try:
        proc = subprocess.run(argv, cwd=target, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL,
                              env={**os.environ, "npm_config_update_notifier": "false"})
    except subprocess.TimeoutExpired as exc:
        raise CodexUnavailable(
            f"`{' '.join(argv)}` in {target} timed out after {timeout}s; is the npm registry reachable?") from exc
    if proc.returncode != 0 or not binary.is_file():
        raise CodexUnavailable(
            f"`npm {command}` of {CODEX_PACKAGE}@{CODEX_VERSION} in {target} failed (exit "
            f"{proc.returncode}; binary {'present' if binary.is_file() else 'missing'} at {binary}); "
            f"is the npm registry reachable?\n{_tail(proc.stdout + proc.stderr)}")
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


def _tail(text: str, limit: int = 4000) -> str:
    return text if len(text) <= limit else "..." + text[-limit:]


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m compose.codex",
                                     description="The pinned OpenAI Codex CLI for tokentrail's end-to-end tests.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("install", help=f"install {CODEX_PACKAGE}@{CODEX_VERSION} into .tokentrail/codex; print its binary")
    parser.parse_args(argv)
    try:
        print(ensure_codex())
    except CodexUnavailable as exc:
        print(f"error: {exc}", file=__import__("sys").stderr)
        return 1
    return 0
