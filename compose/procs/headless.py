"""Run a harness CLI headless, isolated and bounded: the process half of ``compose.harnesses.claude_code``
and ``compose.harnesses.codex`` (any real agent CLI the end-to-end tests drive).

It guarantees:

* A throw-away home (``run_home``): a fresh temporary directory, removed afterwards, unless
  the caller passes one (then it is kept); ``prepare_home`` creates the usual dot-dirs in it.
* An environment built from scratch (``base_env``): only PATH, LANG and USER are taken from
  this process; HOME, TMPDIR and every XDG dir point into the run's home, SHELL is bash, TERM
  is ``dumb``. ``with_overrides`` applies caller overrides, a ``None`` value removing a key.
* ``run_headless(argv, cwd=, env=, timeout=)``: stdin is ``/dev/null``, stdout and stderr are
  collected whole; the CLI runs in its own session and process group under a small subreaper
  parent (``_REAPER``) that, when the CLI exits or at the timeout, SIGKILLs everything the
  CLI's tools left running (background jobs, ``nohup``, ``setsid``, double forks and PTY
  sessions included: orphans are re-parented to the reaper). At ``timeout`` seconds the run is
  SIGTERMed (the reaper kills the CLI and its descendants), after a further grace the whole
  process group is SIGKILLed, and ``timed_out`` is set with ``returncode`` ``None``; what the CLI
  printed before is kept. On return no process of the run is left (the group is killed once
  more in any case). If the driver itself dies (``kill -9`` included) the reaper gets SIGTERM
  (``PR_SET_PDEATHSIG``) and ends the run the same way; ``stop_group`` ends one on demand.
* ``json_events``: the JSON objects of a line-delimited event stream (other lines skipped);
  ``tail``: the last characters of a long output, for results and error messages.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Sub-directories of a run's home that ``base_env`` points at (TMPDIR and the XDG dirs).
HOME_DIRS = ("tmp", ".config", ".cache", ".local/share", ".local/state")

#: How long a run SIGTERMed at its timeout may take to exit before its group is SIGKILLed.
KILL_GRACE_S = 15.0


@dataclass(frozen=True)
class Finished:
    """How a ``run_headless`` run ended, with its whole (decoded) output."""

    returncode: int | None  # None: killed at the timeout
    timed_out: bool
    stdout: str
    stderr: str


def tail(text: str, limit: int = 4000) -> str:
    """``text``, or its last ``limit`` characters after ``...`` when it is longer."""
    return text if len(text) <= limit else "..." + text[-limit:]


def json_events(stdout: str) -> list[dict[str, Any]]:
    """The JSON objects of line-delimited JSON output (one per line; other lines skipped)."""
    events = []
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                events.append(value)
    return events


# --------------------------------------------------------------------------- home and environment


def base_env(home: Path) -> dict[str, str]:
    """The environment every run starts from: nothing is inherited but PATH, locale and USER."""
    return {
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
    }


def with_overrides(env: dict[str, str], extra: dict[str, str | None] | None) -> dict[str, str]:
    """``env`` with ``extra`` applied in place: a value replaces an entry, ``None`` removes it."""
    for key, value in (extra or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def prepare_home(home: Path, *dirs: str) -> None:
    """Create ``HOME_DIRS`` and ``dirs`` (the CLI's own config dir) inside ``home``."""
    for sub in (*HOME_DIRS, *dirs):
        (home / sub).mkdir(parents=True, exist_ok=True)


@contextlib.contextmanager
def run_home(home: Path | None, *, prefix: str) -> Iterator[Path]:
    """``home`` as given (kept afterwards), or a fresh temporary directory removed afterwards."""
    if home is not None:
        yield home
        return
    fresh = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield fresh
    finally:
        shutil.rmtree(fresh, ignore_errors=True)


# --------------------------------------------------------------------------- run


def run_headless(argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float,
                 grace: float = KILL_GRACE_S, on_spawn: Callable[[int], None] | None = None) -> Finished:
    """Run ``argv`` in ``cwd`` with exactly ``env``; never leaves a process behind (see the module).

    ``on_spawn`` gets the run's process-group id as soon as it exists, so a driver running
    many of these (``tokentrail collect``) can stop them all at once (``stop_group``).
    """
    timed_out = False
    # The reaper (see _REAPER) is the CLI's parent: it outlives the CLI, adopts whatever the
    # CLI's tools left running (setsid and double forks included) and kills all of it.
    proc = subprocess.Popen(
        [sys.executable, "-c", _REAPER, *argv], cwd=cwd, env=env,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True)
    if on_spawn is not None:
        on_spawn(proc.pid)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        proc.send_signal(signal.SIGTERM)  # the reaper kills the CLI and its descendants
        try:
            stdout, stderr = proc.communicate(timeout=grace)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            stdout, stderr = proc.communicate()
    finally:
        if proc.poll() is None:
            _kill_group(proc.pid)
            proc.wait()
        _kill_group(proc.pid)  # anything left in the run's process group
    return Finished(None if timed_out else proc.returncode, timed_out,
                    stdout.decode("utf-8", "replace"), stderr.decode("utf-8", "replace"))


# Runs as ``python -c _REAPER cli ...``: makes itself the child subreaper (Linux), runs the
# CLI, and once the CLI has exited (or on SIGTERM, after killing it) SIGKILLs every process that
# is still its child, over and over, until it has no children left; orphans of the CLI's tools
# are re-parented to it, so nothing started by the run survives it. Exits with the CLI's status.
_REAPER = r"""
import ctypes, os, signal, subprocess, sys, time
cli, stopping = None, False
def _stop(*_):
    global stopping
    stopping = True
    if cli is not None:
        cli.kill()
signal.signal(signal.SIGTERM, _stop)  # before anything is started: a SIGTERM never orphans the CLI
parent = os.getppid()
try:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG: a driver killed by SIGKILL still ends the run
except Exception:
    pass
if os.getppid() != parent:
    sys.exit(137)  # the driver died before the death signal was armed
cli = subprocess.Popen(sys.argv[1:])
if stopping:
    cli.kill()
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


def stop_group(pgid: int) -> None:
    """Ask a run's reaper to end it now (as at its timeout): the CLI and everything it started are killed."""
    try:
        os.kill(pgid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
