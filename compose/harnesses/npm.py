"""Install a native CLI that npm ships, pinned by ``package.json`` + ``package-lock.json``,
into a repo-local cache dir: the install half of ``compose.harnesses.claude_code`` and ``compose.harnesses.codex``.

Such a CLI is a thin npm wrapper package whose optional dependency ``<wrapper>-<platform>``
holds a self-contained native executable; that executable is what gets run (no Node.js at run
time; npm is needed only to install). For one ``NpmPin`` this module guarantees:

* One pin: the install is ``npm ci`` from the pin dir's ``package.json`` and
  ``package-lock.json`` (the lockfile carries the registry's sha512 of every package), copied
  into ``<root>/.tokentrail/<cache_name>/`` (git-ignored). Without the pin files (a wheel), a
  ``package.json`` naming ``package@version`` is written instead and ``npm install`` run.
* No install script runs: ``--ignore-scripts`` (nothing is downloaded from anywhere but the npm
  registry), ``--include=optional`` (overrides an ``omit=optional`` in the user's npmrc: the
  binary *is* the optional dependency), ``--engine-strict=false`` (a wrapper's ``engines`` only
  matter for its scripts), ``--prefer-offline`` (npm's cache, ``~/.npm`` or
  ``npm_config_cache``, integrity-checked against the lockfile, without revalidating).
* Idempotent (``ensure_installed``): when the binary exists and the installed version is the
  pin, no process is started. Safe across concurrent processes: an flock on
  ``<cache dir>/.install.lock`` serializes installs, and the check is repeated under it.
* Failures raise the pin's own exception (``NpmPin.error``) naming the fix: npm missing, the
  install timing out, or npm failing or not producing the binary (with npm's output tail).
* ``npm_platform``/``executable_name``/``package_version`` locate the native binary: npm's
  ``os``/``cpu`` names of this machine, the executable's file name here, and the version in an
  installed package's ``package.json``.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from compose import REPO_ROOT
from compose.procs.headless import tail

CACHE_ROOT = Path(".tokentrail")

_SYSTEMS = {"linux": "linux", "darwin": "darwin", "windows": "win32"}
_MACHINES = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}


@dataclass(frozen=True)
class NpmPin:
    """One npm-shipped CLI, pinned."""

    package: str  # the npm wrapper package, e.g. "@openai/codex"
    version: str  # the pinned version; equals the pin files' (a unit test per CLI keeps them in step)
    pin_dir: Path  # holds package.json and package-lock.json
    cache_name: str  # installs into <root>/.tokentrail/<cache_name>
    module: str  # the Python package whose ``python -m <module> install`` installs it
    error: type[Exception]  # raised, naming the fix, when it cannot be installed
    node: str = "18"  # the Node.js version (bringing npm) to name when npm is missing

    def install_dir(self, root: Path | None = None) -> Path:
        return (root or REPO_ROOT) / CACHE_ROOT / self.cache_name

    def pin_files(self) -> dict[str, str]:
        """package.json (+ package-lock.json when shipped) to install from."""
        files: dict[str, str] = {}
        manifest = self.pin_dir / "package.json"
        if manifest.is_file():
            files["package.json"] = manifest.read_text()
            lock = self.pin_dir / "package-lock.json"
            if lock.is_file():
                files["package-lock.json"] = lock.read_text()
        else:  # a wheel without the pin files: the constant is the pin
            files["package.json"] = json.dumps(
                {"name": f"tokentrail-{self.cache_name}", "private": True,
                 "dependencies": {self.package: self.version}}, indent=2) + "\n"
        return files


def npm_platform() -> tuple[str | None, str | None]:
    """This machine as npm's ``os`` and ``cpu`` name it (``("linux", "x64")``); None: not one npm knows."""
    return _SYSTEMS.get(platform.system().lower()), _MACHINES.get(platform.machine().lower())


def executable_name(name: str) -> str:
    """``name`` as a native executable's file name here (``.exe`` on Windows)."""
    return f"{name}.exe" if platform.system() == "Windows" else name


def package_version(package_dir: Path) -> str | None:
    """The ``version`` in an installed package's ``package.json``; None when absent or unreadable."""
    try:
        return json.loads((package_dir / "package.json").read_text()).get("version")
    except (OSError, ValueError, AttributeError):
        return None


def ensure_installed(pin: NpmPin, binary: Path, installed_version: Callable[[], str | None], *,
                     root: Path | None = None, timeout: float = 600) -> Path:
    """Install ``pin`` into ``pin.install_dir(root)`` unless ``binary`` exists and
    ``installed_version()`` is the pin; return ``binary``. See the module for the guarantees."""
    def ready() -> bool:
        return binary.is_file() and installed_version() == pin.version

    if ready():
        return binary
    target = pin.install_dir(root)
    npm = shutil.which("npm")
    if npm is None:
        raise pin.error(
            f"npm is not on PATH: install Node.js >= {pin.node} (it brings npm), then run "
            f"`python -m {pin.module} install` (or copy {pin.module.replace('.', '/')}/package.json and "
            f"package-lock.json into {target} and run `npm ci --ignore-scripts` there)")
    target.mkdir(parents=True, exist_ok=True)
    with install_lock(target):
        if ready():
            return binary  # another process installed it meanwhile
        return _npm_install(pin, npm, target, binary, timeout)


def _npm_install(pin: NpmPin, npm: str, target: Path, binary: Path, timeout: float) -> Path:
    files = pin.pin_files()
    for name in ("package.json", "package-lock.json"):
        if name in files:
            (target / name).write_text(files[name])
        else:
            (target / name).unlink(missing_ok=True)
    command = "ci" if "package-lock.json" in files else "install"
    argv = [npm, command, "--ignore-scripts", "--include=optional", "--engine-strict=false",
            "--prefer-offline", "--no-audit", "--no-fund", "--loglevel=error"]
    try:
        proc = subprocess.run(argv, cwd=target, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL,
                              env={**os.environ, "npm_config_update_notifier": "false"})
    except subprocess.TimeoutExpired as exc:
        raise pin.error(
            f"`{' '.join(argv)}` in {target} timed out after {timeout}s; is the npm registry reachable?") from exc
    if proc.returncode != 0 or not binary.is_file():
        raise pin.error(
            f"`npm {command}` of {pin.package}@{pin.version} in {target} failed (exit "
            f"{proc.returncode}; binary {'present' if binary.is_file() else 'missing'} at {binary}); "
            f"is the npm registry reachable?\n{tail(proc.stdout + proc.stderr)}")
    return binary


@contextlib.contextmanager
def install_lock(target: Path) -> Iterator[None]:
    """An exclusive flock on ``target/.install.lock`` (no lock on Windows)."""
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
