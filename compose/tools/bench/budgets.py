"""Every performance budget in one table (``make bench``): each benchmark run, its budget lines collected.

Runs the benchmarks one after another, each in its own process with arguments sized so the
whole table takes about ten minutes on a 2-core machine, and collects the lines each prints
for the table:

    BUDGET <name> value=<number> budget=<op><number> [baseline=<number> ratio=<number>] ok=<true|false>
    FIGURE <name> value=<number>          (a figure with no budget of its own, e.g. memory per rollout)

A baseline is measured in the same run as its figure (a bare Kafka ack, the pure fold, one copy
of the projection's bytes), so a ratio compares like with like on whatever machine runs it. The
table lists each line with the benchmark that printed it; a benchmark that fails is a row saying
so, and the command exits 1 if any benchmark failed or any budget was missed. ``--only`` runs a
subset; ``--out`` also writes the table to a file.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# name -> arguments: sized for ~10 minutes in all on this machine (each bench's defaults are larger). A name
# with a suffix ("interceptor-stream") runs the bench before the dash with other arguments.
BENCHES: dict[str, list[str]] = {
    "capture": ["--rounds", "3", "--calls", "100", "--dialect", "all"],
    "interceptor": ["--deployment", "both", "--rounds", "2", "--calls-per-round", "128", "--concurrency", "64",
                    "--broker-warmup", "2000"],
    # Streamed calls through the proxy, as Claude Code and Codex make them (one SSE event per token)
    "interceptor-stream": ["--deployment", "proxy", "--stream", "--rounds", "2", "--calls-per-round", "128",
                           "--concurrency", "64", "--broker-warmup", "2000"],
    "wire": [],
    "fold": [],
    "rebuild": ["--calls", "200", "--tokens", "131072", "--repeat", "5"],
    "memory": ["--rollouts", "1000", "10000", "--modes", "index", "spool"],
    "e2e": ["--concurrency", "1", "32", "--rollouts", "48"],
}
_LINE = re.compile(r"^(BUDGET|FIGURE) (\S+) (.*)$")


def budget_line(name: str, value: float, budget: float, *, op: str = "<=", baseline: float | None = None,
                ratio: float | None = None) -> str:
    """``BUDGET <name> value=<n> budget=<op><n> [baseline=<n> ratio=<r>] ok=<true|false>``: the one home of
    the format ``parse`` reads. ``ratio`` defaults to ``value / baseline``; a figure that is itself a ratio
    to its baseline passes it."""
    ok = value >= budget if op == ">=" else value <= budget
    against = ""
    if baseline:
        against = f" baseline={_number(baseline)} ratio={(value / baseline if ratio is None else ratio):.3f}"
    return f"BUDGET {name} value={_number(value)} budget={op}{budget:g}{against} ok={str(ok).lower()}"


def figure_line(name: str, value: float) -> str:
    """``FIGURE <name> value=<n>``: a figure with no budget of its own, collected into the table too."""
    return f"FIGURE {name} value={_number(value)}"


def _number(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3f}"


@dataclass(frozen=True)
class Row:
    bench: str
    kind: str
    name: str
    fields: dict[str, str]

    @property
    def ok(self) -> bool:
        return self.kind == "FIGURE" or self.fields.get("ok") == "true"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--only", nargs="+", choices=list(BENCHES), help="run these benchmarks only")
    parser.add_argument("--out", type=Path, help="also write the table here")


def parse(bench: str, output: str) -> list[Row]:
    """The BUDGET and FIGURE lines of one benchmark's output."""
    rows = []
    for line in output.splitlines():
        match = _LINE.match(line.strip())
        if match:
            fields = dict(part.split("=", 1) for part in match.group(3).split() if "=" in part)
            rows.append(Row(bench, match.group(1), match.group(2), fields))
    return rows


def render(rows: list[Row], failed: dict[str, str], seconds: dict[str, float]) -> str:
    head = f"{'bench':<18} {'figure':<40} {'value':>12} {'budget':>10} {'baseline':>12} {'ratio':>7}  ok"
    lines = [head, "-" * len(head)]
    for row in rows:
        f = row.fields
        lines.append(f"{row.bench:<18} {row.name:<40} {f.get('value', ''):>12} {f.get('budget', '-'):>10} "
                     f"{f.get('baseline', ''):>12} {f.get('ratio', ''):>7}  "
                     f"{'-' if row.kind == 'FIGURE' else ('yes' if row.ok else 'NO')}")
    for bench, why in failed.items():
        lines.append(f"{bench:<18} {'(the benchmark failed)':<40} {why}")
    lines.append("")
    lines.append("took " + ", ".join(f"{b} {s:.0f} s" for b, s in seconds.items()))
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    rows: list[Row] = []
    failed: dict[str, str] = {}
    seconds: dict[str, float] = {}
    for bench, extra in BENCHES.items():
        if args.only and bench not in args.only:
            continue
        argv = [sys.executable, "-m", "compose.cli", "bench", bench.split("-")[0], *extra]
        print(f"== tokentrail bench {' '.join(argv[4:])}", flush=True)
        start = time.monotonic()
        out = subprocess.run(argv, capture_output=True, text=True)
        seconds[bench] = time.monotonic() - start
        print(out.stdout, flush=True)
        found = parse(bench, out.stdout)
        if out.returncode != 0 or not found:
            tail = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["no output"]
            failed[bench] = f"exit {out.returncode}: {tail[0][:120]}" if out.returncode else "printed no budget line"
        rows += found
    table = render(rows, failed, seconds)
    print(table)
    if args.out:
        args.out.write_text(table + "\n")
    return 0 if not failed and all(row.ok for row in rows) else 1
