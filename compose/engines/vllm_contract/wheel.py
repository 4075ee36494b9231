"""A vLLM wheel as a zip of source text: found or downloaded, hashed, and read member by member.

vLLM cannot be imported where there is no GPU build of torch (no CPU build exists past
0.32), and it need not be: its request and response models are plain pydantic source.
``obtain(spec)`` takes a wheel's path, or a version (``0.34.0``), which it downloads once
with ``pip download --no-deps --only-binary=:all: vllm==VERSION`` (the ordinary registry
client; a ~240 MB CUDA wheel, of which only a few ``.py`` members are ever read) into a
cache folder, and returns the path. ``Wheel`` reads members without extracting the rest.

Guarantees: a member that is not in the wheel is an error naming it and the wheel (a vLLM
release that moved a file must be looked at, not skipped); ``sha256`` is the hash of the
wheel's bytes as PyPI serves them (compare with the registry's listed digest).
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

from schemas.errors import TokentrailError

_VERSION = re.compile(r"^\d+\.\d+(\.\d+)?([.\w+-]*)$")
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tokentrail" / "vllm-wheels"


class WheelError(TokentrailError):
    """The wheel could not be found, downloaded or read; the message says which and how to fix it."""


def obtain(spec: str, cache: Path = DEFAULT_CACHE) -> Path:
    """The wheel named by ``spec``: an existing ``.whl`` path, or a vLLM version to download into ``cache``."""
    path = Path(spec)
    if path.suffix == ".whl":
        if not path.is_file():
            raise WheelError(f"--wheel {spec}: no such file; give a vllm-*.whl path or a version such as 0.34.0")
        return path
    if not _VERSION.match(spec):
        raise WheelError(f"--wheel {spec!r}: neither a .whl path nor a version (such as 0.34.0)")
    found = sorted(cache.glob(f"vllm-{spec}-*.whl"))
    if found:
        return found[-1]
    cache.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
               "--quiet", f"vllm=={spec}", "-d", str(cache)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    found = sorted(cache.glob(f"vllm-{spec}-*.whl"))
    if done.returncode != 0 or not found:
        raise WheelError(f"pip download vllm=={spec} failed ({done.returncode}): {done.stderr.strip()[-600:]}; "
                         f"check the version exists on the registry, or pass --wheel PATH to a wheel you have")
    return found[-1]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class Wheel:
    """Read-only access to a wheel's members (the zip's central directory is read once)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._zip = zipfile.ZipFile(path)
        except (OSError, zipfile.BadZipFile) as exc:
            raise WheelError(f"{path}: not a readable wheel ({exc}); download it again") from exc
        self._names = set(self._zip.namelist())

    def __enter__(self) -> Wheel:
        return self

    def __exit__(self, *exc: object) -> None:
        self._zip.close()

    def text(self, member: str) -> str:
        if member not in self._names:
            raise WheelError(f"{self.path.name} has no {member}: the release moved or removed it; update "
                             f"compose/engines/vllm_contract/generate.py's SOURCES to where it went")
        return self._zip.read(member).decode("utf-8")

    def version(self) -> tuple[str, str]:
        """(``__version__``, ``__commit_id__``) from ``vllm/_version.py``."""
        text = self.text("vllm/_version.py")
        version = re.search(r"^__version__ = version = '([^']+)'", text, re.M)
        commit = re.search(r"^__commit_id__ = commit_id = '([^']*)'", text, re.M)
        if version is None:
            raise WheelError(f"{self.path.name}: vllm/_version.py names no __version__")
        return version.group(1), commit.group(1) if commit else ""
