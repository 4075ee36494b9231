"""What the tests of the npm-pinned harness CLIs (``compose.harnesses.claude_code``, ``compose.harnesses.codex``) share:
the pin checks, installing the real CLI or skipping with the reason, a stub that never
answers, and finding the processes a run may have left behind (through ``/proc``)."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest


def check_pins(pin_dir: Path, package: str, version: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Assert that package.json and package-lock.json in ``pin_dir`` pin ``package@version`` (the
    wrapper with a sha512, and a linux-x64 binary package among the platform ones); return the
    lockfile's wrapper entry and its ``node_modules/<package>-<platform>`` entries."""
    manifest = json.loads((pin_dir / "package.json").read_text())
    lock = json.loads((pin_dir / "package-lock.json").read_text())
    assert manifest["dependencies"] == {package: version}
    assert lock["packages"][""]["dependencies"] == manifest["dependencies"]
    wrapper = lock["packages"][f"node_modules/{package}"]
    assert wrapper["version"] == version
    assert wrapper["integrity"].startswith("sha512-")
    natives = {k: v for k, v in lock["packages"].items() if k.startswith(f"node_modules/{package}-")}
    assert f"node_modules/{package}-linux-x64" in natives
    return wrapper, natives


def installed_or_skip(ensure: Callable[[], Path], unavailable: type[Exception], what: str) -> Path:
    """``ensure()``'s binary, or skip the test naming why ``what`` cannot be installed here."""
    try:
        return ensure()
    except unavailable as exc:
        pytest.skip(f"{what} unavailable here: {exc}")


@contextlib.contextmanager
def stalled_stub(stub_class: Callable[[Callable[[dict], Any]], Any], reply: Callable[[], Any]) -> Iterator[Any]:
    """A running ``stub_class(responder)`` whose responder holds every request (up to 60 s) and
    then answers ``reply()``; the held requests are released once the stub is closed."""
    release = threading.Event()

    def never_answers(body: dict) -> Any:
        release.wait(60)
        return reply()

    try:
        with stub_class(never_answers) as stub:
            yield stub
    finally:
        release.set()


def processes_with(marker: str, *, unless: str | None = None) -> list[str]:
    """``pid: cmdline`` of each process whose command line contains ``marker`` (and not ``unless``)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline and (unless is None or unless not in cmdline):
            found.append(f"{pid}: {cmdline}")
    return found


def processes_in_home(home: Path) -> list[str]:
    """Processes whose environment has HOME=home (the CLI and everything it started)."""
    needle = f"HOME={home}".encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                found.append(pid)
        except OSError:
            continue
    return found
