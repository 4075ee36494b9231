"""What the tests of the npm-pinned harness CLIs (``compose.harnesses.claude_code``, ``compose.harnesses.codex``,
``compose.harnesses.gemini_cli``) share: the pin checks, npm faked for the install tests,
installing the real CLI or skipping with the reason, a fake CLI executable and its runs, a stub
that never answers, finding the processes a run may have left behind (through ``/proc``), and the
timeout and process-tree checks built on them."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from compose.harnesses import npm

#: On a test that looks for left-over processes.
needs_proc = pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc to find processes")


def check_pin_files(pin_dir: Path, package: str, version: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Assert that package.json and package-lock.json in ``pin_dir`` pin ``package@version`` (with
    a sha512); return the lockfile's entry of the package and the whole lockfile."""
    manifest = json.loads((pin_dir / "package.json").read_text())
    lock = json.loads((pin_dir / "package-lock.json").read_text())
    assert manifest["dependencies"] == {package: version}
    assert lock["packages"][""]["dependencies"] == manifest["dependencies"]
    wrapper = lock["packages"][f"node_modules/{package}"]
    assert wrapper["version"] == version
    assert wrapper["integrity"].startswith("sha512-")
    return wrapper, lock


def check_pins(pin_dir: Path, package: str, version: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """``check_pin_files``, and a linux-x64 binary package among the platform ones; return the
    lockfile's wrapper entry and its ``node_modules/<package>-<platform>`` entries."""
    wrapper, lock = check_pin_files(pin_dir, package, version)
    natives = {k: v for k, v in lock["packages"].items() if k.startswith(f"node_modules/{package}-")}
    assert f"node_modules/{package}-linux-x64" in natives
    return wrapper, natives


def forbid_npm(monkeypatch: pytest.MonkeyPatch, what: str) -> None:
    """No npm on PATH, and a failure naming ``what`` if it starts a process anyway."""

    def no_process(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"{what} started a process although the pin is installed")

    monkeypatch.setattr(npm.subprocess, "run", no_process)
    monkeypatch.setattr(npm.shutil, "which", lambda name: None)


def fake_npm_ci(monkeypatch: pytest.MonkeyPatch, install: Callable[[], Any]) -> list[tuple[list[str], Path]]:
    """npm at ``/usr/bin/npm`` whose every run calls ``install()`` and succeeds; return the list its
    runs are appended to, as ``(argv, cwd)``."""
    calls: list[tuple[list[str], Path]] = []

    def fake_run(argv: list[str], cwd: str | Path, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        calls.append((argv, Path(cwd)))
        install()
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(npm.shutil, "which", lambda name: "/usr/bin/npm")
    monkeypatch.setattr(npm.subprocess, "run", fake_run)
    return calls


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


def python_script(path: Path, body: str) -> Path:
    """An executable file at ``path`` that runs ``body`` with this interpreter."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def run_fake_cli(tmp_path: Path, mode: str, events: list[dict[str, Any]],
                 run: Callable[[Path, dict[str, str]], Any], env: dict[str, str] | None = None) -> tuple[Any, dict]:
    """``run(workdir, env)`` with the environment a fake CLI reads (``STUB_RECORD``, ``STUB_MODE``,
    ``STUB_EVENTS``, then ``env``); return its result and what the fake CLI recorded."""
    record = tmp_path / f"record-{mode}.json"
    workdir = tmp_path / "work"
    workdir.mkdir(exist_ok=True)
    result = run(workdir, {"STUB_RECORD": str(record), "STUB_MODE": mode, "STUB_EVENTS": json.dumps(events),
                           **(env or {})})
    return result, json.loads(record.read_text())


def check_the_timeout_kills_the_tree(run_stub: Callable[..., tuple[Any, dict]], sleeper: str) -> Any:
    """A fake CLI in mode ``hang`` (it starts ``sleep <sleeper>7<n>`` children, then hangs) is
    killed at a 3 s timeout, promptly, with every process it started; return the result."""
    started = time.monotonic()
    result, _ = run_stub("hang", timeout=3, env={"STUB_MARKER": "7"})
    assert result.timed_out and result.returncode is None and not result.ok
    assert time.monotonic() - started < 15
    assert processes_with(f"sleep {sleeper}7", unless="STUB") == []
    return result


def check_no_process_outlives_a_normal_exit(run_stub: Callable[..., tuple[Any, dict]], sleeper: str) -> None:
    """A fake CLI in mode ``leave`` (it starts ``sleep <sleeper>8<n>`` children, then exits 0)
    leaves none of them running."""
    result, _ = run_stub("leave", env={"STUB_MARKER": "8"})
    assert result.ok
    assert processes_with(f"sleep {sleeper}8", unless="STUB") == []


def check_real_cli_killed_at_the_timeout(tmp_path: Path, stub_class: Callable[[Callable[[dict], Any]], Any],
                                         late_reply: Callable[[], Any], run: Callable[[Any, Path], Any],
                                         model_requests: Callable[[Any], list]) -> Any:
    """``run(stub, home)`` against a stub that never answers must time out with no exit code,
    after at least one model request, leaving no process with that HOME; return the result."""
    home = tmp_path / "home-for-timeout-test"
    home.mkdir()
    with stalled_stub(stub_class, late_reply) as stub:
        result = run(stub, home)
        assert result.timed_out and result.returncode is None
        assert len(model_requests(stub)) >= 1
        assert processes_in_home(home) == []
    return result


def sleepers_source(sleeper: str) -> str:
    """Source lines for a fake CLI (``os``, ``subprocess`` and ``time`` imported): read ``mode`` and
    ``marker``, and in modes hang and leave start ``sleep <sleeper><marker><n>`` as a plain child,
    a setsid'd grandchild and a double fork (all must die with the run)."""
    return (f'mode = os.environ.get("STUB_MODE", "ok")\n'
            f'marker = os.environ.get("STUB_MARKER", "0")\n'
            f'if mode in ("hang", "leave"):\n'
            f'    subprocess.Popen(["sleep", "{sleeper}" + marker + "1"])\n'
            f'    subprocess.Popen(["setsid", "sleep", "{sleeper}" + marker + "2"])\n'
            f'    subprocess.Popen(["sh", "-c", "(sleep {sleeper}" + marker + "3 &)"])\n'
            f'    time.sleep(0.5)\n')
