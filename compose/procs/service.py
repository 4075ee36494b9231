"""One ``tokentrail`` subcommand as a child process of a local stack: spawn, wait until ready, stop.

Guarantees:

- a service runs in its own session and process group (``start_new_session``), so a
  stop or a ``kill -9`` reaches exactly it and whatever it started;
- its stdout and stderr go to its log file (appended to on a restart), unbuffered;
- ``wait_line`` / ``wait_http`` return once it is ready or raise `StackError` with the end
  of its log, as soon as it exits and at the deadline: nobody waits on a dead process;
- ``terminate`` is SIGTERM to the group, then SIGKILL after a grace period, and reaps it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from schemas.errors import TokentrailError

__all__ = ["StackError", "Service", "pick_free_ports", "spawn", "terminate"]


class StackError(TokentrailError, RuntimeError):
    """A service did not come up; the message carries the end of its log."""


@dataclass
class Service:
    name: str
    proc: subprocess.Popen
    log: Path
    url: str | None = None
    argv: tuple[str, ...] = ()  # the `tokentrail` arguments it was started with (what a restart runs again)
    env: dict[str, str] | None = None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def wait_line(self, needle: str, timeout: float = 30.0, since: int = 0) -> str:
        """The first log line after byte ``since`` that contains ``needle``, once it is written."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.log.read_bytes()[since:].decode(errors="replace").splitlines():
                if needle in line:
                    return line.strip()
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise StackError(f"{self.name} did not report {needle!r}:\n{self.log_tail()}")

    def wait_http(self, path: str, timeout: float = 30.0) -> None:
        """Return once ``GET {url}{path}`` answers 200."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}{path}", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise StackError(f"{self.name} did not answer {path}:\n{self.log_tail()}")


def spawn(name: str, argv: tuple[str, ...], *, log: Path, env: dict[str, str] | None = None,
          append: bool = False, die_with_parent: bool = False) -> Service:
    """Start ``tokentrail <argv>`` (this interpreter, ``compose.cli``) as the service ``name``.

    ``die_with_parent``: the service gets SIGTERM when the spawning *thread* ends (see
    `_die_with_parent`), the end of a ``kill -9`` of this process included.
    """
    handle = open(log, "ab" if append else "wb")
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "compose.cli", *argv],
            stdout=handle, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            preexec_fn=_die_with_parent if die_with_parent else None,
        )
    finally:
        handle.close()
    return Service(name, proc, log, argv=argv, env=env)


def terminate(*procs: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM each process group, SIGKILL those still running ``grace`` seconds later; all reaped either way.

    All are signalled first and waited for against one deadline: a stack's services stop side by side
    (each clean stop is mostly its own Kafka client closing), not one after another.
    """
    deadline = time.monotonic() + grace
    running = [proc for proc in procs if proc.poll() is None]
    for proc in running:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for proc in running:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when its parent dies (PR_SET_PDEATHSIG).

    The kernel's "parent" is the spawning *thread*: a service started from a worker thread
    (``asyncio.to_thread``) is stopped when that thread ends. Start services from a long-lived thread.
    """
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)


def pick_free_ports(n: int = 2) -> list[int]:
    """``n`` distinct free loopback ports (all sockets stay bound until all are picked)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
