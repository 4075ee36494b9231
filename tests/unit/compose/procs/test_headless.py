"""``run_headless`` ends its run when asked (``stop_group``) and when its driver dies, even by SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from compose.procs.headless import base_env, run_headless, stop_group

SLEEPER = [sys.executable, "-c", "import time; time.sleep(300)"]


def _under(root: Path) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/cwd").startswith(str(root)):
                    pids.append(int(entry))
            except OSError:
                pass
    return pids


def _wait_gone(root: Path, timeout: float = 20.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _under(root):
        time.sleep(0.1)
    return _under(root)


def test_stop_group_ends_a_run_in_flight(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    spawned: list[int] = []
    done: list = []
    t = threading.Thread(target=lambda: done.append(run_headless(
        SLEEPER, cwd=work, env=base_env(tmp_path), timeout=300, on_spawn=spawned.append)))
    t.start()
    deadline = time.monotonic() + 20
    while not (spawned and len(_under(work)) >= 2) and time.monotonic() < deadline:
        time.sleep(0.05)  # the reaper and the CLI are both up
    stop_group(spawned[0])
    t.join(30)
    assert done and done[0].returncode != 0 and not done[0].timed_out
    assert _wait_gone(work) == []


def test_a_run_does_not_outlive_a_driver_killed_by_sigkill(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    driver = subprocess.Popen([sys.executable, "-c", (
        "import sys; from pathlib import Path; from compose.procs.headless import base_env, run_headless; "
        f"run_headless({SLEEPER!r}, cwd=Path({str(work)!r}), env=base_env(Path({str(tmp_path)!r})), timeout=300, "
        "on_spawn=lambda pgid: print(pgid, flush=True))")], stdout=subprocess.PIPE, text=True,
        cwd=Path(__file__).resolve().parents[4])
    assert driver.stdout.readline().strip().isdigit()
    deadline = time.monotonic() + 20
    while len(_under(work)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(_under(work)) >= 2, "the reaper and the CLI never started"
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait(10)
    assert _wait_gone(work) == [], "the CLI outlived its killed driver"
