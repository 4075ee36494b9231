"""Install the pinned Codex CLI repo-locally (npm), without running any install script.

The install itself (pin files, ``npm ci --ignore-scripts``, idempotence, the flock) is
``compose.harnesses.npm``'s; this module names the pin and where its native binary lies. The wrapper
``@openai/codex`` has no install scripts; its optional dependency ``@openai/codex-<platform>``
(an alias of ``@openai/codex@<version>-<platform>``, from the npm registry like the wrapper)
carries the native binary under ``vendor/<triple>/bin/codex``.
"""

from __future__ import annotations

import platform
from pathlib import Path

from compose.harnesses import npm
from schemas.errors import TokentrailError

CODEX_VERSION = "0.171.0"
CODEX_PACKAGE = "@openai/codex"

PIN_DIR = Path(__file__).resolve().parent  # package.json and package-lock.json live beside this module

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


class CodexUnavailable(TokentrailError, RuntimeError):
    """The CLI cannot be installed here (no npm, no registry, no binary for this platform)."""


PIN = npm.NpmPin(package=CODEX_PACKAGE, version=CODEX_VERSION, pin_dir=PIN_DIR, cache_name="codex",
                     module="compose.harnesses.codex", error=CodexUnavailable, node="16")


def _target() -> tuple[str, str]:
    system, machine = npm.npm_platform()
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
    return PIN.install_dir(root)


def vendor_dir(root: Path | None = None) -> Path:
    """``vendor/<triple>`` of the platform package: ``bin/codex``, ``codex-path/rg``, ``codex-resources``."""
    return install_dir(root) / "node_modules" / platform_package() / "vendor" / target_triple()


def binary_path(root: Path | None = None) -> Path:
    """Where the native executable lives once installed (it may not exist yet)."""
    return vendor_dir(root) / "bin" / npm.executable_name("codex")


def installed_version(root: Path | None = None) -> str | None:
    """The installed CLI's version, when the wrapper and this platform's binary package agree."""
    modules = install_dir(root) / "node_modules"
    wrapper = npm.package_version(modules / CODEX_PACKAGE)
    native = npm.package_version(modules / platform_package())  # "<version>-<platform>"
    if wrapper is None or native != f"{wrapper}-{_target()[0]}":
        return None
    return wrapper


def ensure_codex(root: Path | None = None, *, timeout: float = 600) -> Path:
    """Install the pinned CLI into ``<root>/.tokentrail/codex`` if needed; return its binary.

    Idempotent: with the pinned version's binary already there, no process is started. Safe to
    call from concurrent processes (an flock serializes installs). Raises ``CodexUnavailable``
    (naming the fix) when npm is missing or the install fails.
    """
    return npm.ensure_installed(PIN, binary_path(root), lambda: installed_version(root),
                                    root=root, timeout=timeout)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m compose.harnesses.codex",
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
