"""Install the pinned Claude Code CLI repo-locally (npm), without running its install scripts.

The install itself (pin files, ``npm ci --ignore-scripts``, idempotence, the flock) is
``compose.harnesses.npm``'s; this module names the pin and where its native binary lies. The
wrapper's postinstall only hard-links the native binary over its ``bin/claude.exe``
placeholder; with ``--ignore-scripts`` it never runs and the binary is run from the platform
package directly (so ``node_modules/.bin/claude`` stays the placeholder that prints an error:
don't use it). The wrapper declares ``node>=22``, which only matters for its ``install.cjs``.
"""

from __future__ import annotations

import platform
from pathlib import Path

from compose.harnesses import npm
from schemas.errors import TokentrailError

CLAUDE_CODE_VERSION = "2.1.332"
CLAUDE_CODE_PACKAGE = "@anthropic-ai/claude-code"

PIN_DIR = Path(__file__).resolve().parent  # package.json and package-lock.json live beside this module


class ClaudeCodeUnavailable(TokentrailError, RuntimeError):
    """The CLI cannot be installed here (no npm, no registry, no binary for this platform)."""


PIN = npm.NpmPin(package=CLAUDE_CODE_PACKAGE, version=CLAUDE_CODE_VERSION, pin_dir=PIN_DIR,
                     cache_name="claude-code", module="compose.harnesses.claude_code", error=ClaudeCodeUnavailable,
                     node="18")


def platform_package() -> str:
    """The npm package holding the native binary for this machine, e.g. ``...-linux-x64``."""
    system, machine = npm.npm_platform()
    if system is None or machine is None:
        raise ClaudeCodeUnavailable(
            f"Claude Code ships no native binary for {platform.system()} {platform.machine()}")
    suffix = f"{system}-{machine}"
    if system == "linux" and platform.libc_ver()[0] != "glibc":
        suffix += "-musl"
    return f"{CLAUDE_CODE_PACKAGE}-{suffix}"


def install_dir(root: Path | None = None) -> Path:
    return PIN.install_dir(root)


def binary_path(root: Path | None = None) -> Path:
    """Where the native executable lives once installed (it may not exist yet)."""
    return install_dir(root) / "node_modules" / platform_package() / npm.executable_name("claude")


def _installed_version(root: Path | None) -> str | None:
    return npm.package_version(install_dir(root) / "node_modules" / CLAUDE_CODE_PACKAGE)


def ensure_claude_code(root: Path | None = None, *, timeout: float = 600) -> Path:
    """Install the pinned CLI into ``<root>/.tokentrail/claude-code`` if needed; return its binary.

    Idempotent: with the pinned version's binary already there, no process is started. Safe to
    call from concurrent processes (an flock serializes installs). Raises
    ``ClaudeCodeUnavailable`` (naming the fix) when npm is missing or the install fails.
    """
    return npm.ensure_installed(PIN, binary_path(root), lambda: _installed_version(root),
                                    root=root, timeout=timeout)
