"""py-spy profiles of a bench's process: record one over a measured span, and read its top frames.

Every process profile under ``docs/perf/`` comes from here: ``record -r 250 -f raw --gil`` (only
the thread holding the GIL is sampled, which on a 2-core machine shared with a broker is the honest
picture of the process's Python CPU), started and stopped around the span a bench measures, so
start-up and warm-up are left out. ``top_frames`` turns the raw file into the lines the docs quote.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

__all__ = ["PySpy", "top_frames"]


class PySpy:
    """``py-spy record`` of process ``pid`` into ``out`` (raw format) from ``start()`` to ``stop()``.

    py-spy is a dev dependency (``pip install .[dev]``); it needs ptrace permission on the target.
    """

    def __init__(self, pid: int, out: Path) -> None:
        self.pid, self.out = pid, out
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        spy = Path(sys.executable).with_name("py-spy")
        self.proc = subprocess.Popen([str(spy), "record", "-p", str(self.pid), "-r", "250", "-f", "raw", "--gil",
                                      "--nonblocking", "-o", str(self.out)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
            self.proc.wait(60)
            self.proc = None


def top_frames(raw: str, n: int = 20, what: str = "the process over the measured span") -> list[str]:
    """The ``n`` functions with the most samples (own, then inclusive) of a py-spy ``raw`` profile, as lines."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [re.sub(r":\d+\)$", ")", frame) for frame in stack.split(";")]  # by function, not line
        total += int(count)
        own[frames[-1]] += int(count)
        for frame in set(frames):
            inclusive[frame] += int(count)
    lines = [f"{total} samples (250/s of the thread holding the GIL, {what})", "own time:"]
    lines += [f"  {100 * c / max(total, 1):5.1f}%  {frame}" for frame, c in own.most_common(n)]
    lines += ["inclusive (the function and what it calls):"]
    lines += [f"  {100 * c / max(total, 1):5.1f}%  {frame}" for frame, c in inclusive.most_common(n)]
    return lines
