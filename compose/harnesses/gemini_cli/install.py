"""Install the pinned Gemini CLI repo-locally (npm), without running any install script, and find Node.js.

The install itself (pin files, ``npm ci --ignore-scripts``, idempotence, the flock) is
``compose.harnesses.npm``'s; this module names the pin and where its entry script lies. Unlike
Claude Code and Codex, ``@google/gemini-cli`` ships no native executable: it is one esbuild bundle
(``bundle/gemini.js`` and its chunks) run by Node.js, so **Node.js >= 20 is needed at run time**
(``node_executable`` finds it and refuses an older one, naming the fix). Its optional dependencies
(``node-pty``, ``@lydell/node-pty-<platform>``, ``@github/keytar``: prebuilt, used only by the
interactive UI and the keychain) install without their scripts and are never loaded headless.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from compose.harnesses import npm
from schemas.errors import TokentrailError

GEMINI_CLI_VERSION = "0.61.0"
GEMINI_CLI_PACKAGE = "@google/gemini-cli"

#: The oldest Node.js major the pinned bundle runs on (its package.json ``engines.node``).
NODE_MAJOR = 20

PIN_DIR = Path(__file__).resolve().parent  # package.json and package-lock.json live beside this module


class GeminiCliUnavailable(TokentrailError, RuntimeError):
    """The CLI cannot be installed or run here (no npm, no registry, no Node.js >= 20)."""


PIN = npm.NpmPin(package=GEMINI_CLI_PACKAGE, version=GEMINI_CLI_VERSION, pin_dir=PIN_DIR,
                 cache_name="gemini-cli", module="compose.harnesses.gemini_cli", error=GeminiCliUnavailable,
                 node=str(NODE_MAJOR))


def install_dir(root: Path | None = None) -> Path:
    return PIN.install_dir(root)


def package_dir(root: Path | None = None) -> Path:
    return install_dir(root) / "node_modules" / GEMINI_CLI_PACKAGE


def entry_path(root: Path | None = None) -> Path:
    """The CLI's entry script (``bundle/gemini.js``), run as ``node <entry>``; it may not exist yet."""
    return package_dir(root) / "bundle" / "gemini.js"


def installed_version(root: Path | None = None) -> str | None:
    return npm.package_version(package_dir(root))


def ensure_gemini_cli(root: Path | None = None, *, timeout: float = 600) -> Path:
    """Install the pinned CLI into ``<root>/.tokentrail/gemini-cli`` if needed; return its entry script.

    Idempotent: with the pinned version's entry script already there, no process is started. Safe
    to call from concurrent processes (an flock serializes installs). Raises
    ``GeminiCliUnavailable`` (naming the fix) when npm is missing or the install fails.
    """
    return npm.ensure_installed(PIN, entry_path(root), lambda: installed_version(root), root=root,
                                timeout=timeout)


def node_executable(node: str | None = None) -> str:
    """The ``node`` to run the CLI with (``node`` or the PATH's), checked to be Node.js >= ``NODE_MAJOR``.

    Raises ``GeminiCliUnavailable`` naming the fix when it is missing, does not run, or is older.
    """
    found = node or shutil.which("node")
    if found is None:
        raise GeminiCliUnavailable(
            f"node is not on PATH: the Gemini CLI is a Node.js program; install Node.js >= {NODE_MAJOR}")
    try:
        out = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=30,
                             stdin=subprocess.DEVNULL).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GeminiCliUnavailable(f"`{found} --version` failed ({exc}); install Node.js >= {NODE_MAJOR}") from exc
    match = re.fullmatch(r"v(\d+)\.\d+\.\d+\S*", out)
    if match is None or int(match.group(1)) < NODE_MAJOR:
        raise GeminiCliUnavailable(
            f"{found} reports version {out!r}; {GEMINI_CLI_PACKAGE}@{GEMINI_CLI_VERSION} needs Node.js >= "
            f"{NODE_MAJOR}: install a newer Node.js or pass its path")
    return found

