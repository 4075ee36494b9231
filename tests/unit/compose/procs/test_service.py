"""Stopping services: every process group signalled first, stragglers killed at one deadline, all reaped."""

from __future__ import annotations

import subprocess
import sys

from compose.procs.service import terminate

# A child that ignores SIGTERM (a service stuck in its shutdown) and one that exits on it.
STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
POLITE = "import time; print('up', flush=True); time.sleep(60)"


def _start(code: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout.readline() == b"up\n"  # its handler is installed before it is signalled
    return proc


def test_terminate_kills_the_stragglers_after_the_grace_and_reaps_every_process():
    stragglers, gone = [_start(STUBBORN), _start(STUBBORN)], _start(POLITE)
    gone.kill()
    gone.wait()  # already exited: nothing to signal
    terminate(*stragglers, gone, grace=0.5)
    assert [p.returncode for p in stragglers] == [-9, -9]  # SIGKILLed once the shared deadline passed, reaped


def test_terminate_returns_as_soon_as_the_processes_exit_on_sigterm():
    procs = [_start(POLITE) for _ in range(3)]
    terminate(*procs, grace=30.0)
    assert [p.returncode for p in procs] == [-15, -15, -15]
