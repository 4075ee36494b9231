"""``tokentrail soak``: an hour (``--minutes``) of the chaos workload in waves, faults and announcements among them.

Prints one line per sample (every ``--sample-every`` s: calls answered and their p50/p99, consumer lag,
the processor's live state, rollouts delivered, then RSS / open fds / threads of each service), a
table of the waves by fault (the chaos counts, which must all be 0), the RSS growth of each service
from the reference minute to the end, the drain, and the verdict; writes the samples as CSV
(``--csv``, default ``<run-dir>/soak.csv``). Exit 0 only when the verdict is clean
(``compose.tools.soak.run.SoakReport.verdict``), 1 when it is not, 2 for bad arguments.

Kafka: like chaos, the soak runs only against the broker it starts itself (it kills and restarts it).
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

from compose.tools.chaos.faults import FAULTS

__all__ = ["configure", "main", "render", "write_csv"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--minutes", type=float, default=60.0, help="how long the waves run (default 60)")
    parser.add_argument("--rollouts", type=int, default=16, help="concurrent rollouts per wave (default 16)")
    parser.add_argument("--fault-every", type=float, default=300.0, help="seconds between faults (default 300)")
    parser.add_argument("--announce-every", type=float, default=180.0,
                        help="seconds between policy-version announcements (default 180)")
    parser.add_argument("--sample-every", type=float, default=60.0, help="seconds between samples (default 60)")
    parser.add_argument("--faults", default=",".join(FAULTS),
                        help=f"comma-separated faults, taken in turn (default: {','.join(FAULTS)}); '' for none")
    parser.add_argument("--run-dir", type=Path, default=Path(".tokentrail/soak"),
                        help="logs, spool, sink file and the run's own broker (wiped at start)")
    parser.add_argument("--csv", type=Path, default=None, help="the samples as CSV (default <run-dir>/soak.csv)")


def main(args: argparse.Namespace) -> int:
    from compose.tools.soak.run import SoakConfig, run_soak
    from schemas.errors import TokentrailError

    started = time.monotonic()
    try:
        config = SoakConfig(run_dir=args.run_dir.resolve(), minutes=args.minutes, rollouts=args.rollouts,
                            fault_every_s=args.fault_every, announce_every_s=args.announce_every,
                            sample_every_s=args.sample_every,
                            faults=tuple(f.strip() for f in args.faults.split(",") if f.strip()))
    except TokentrailError as exc:
        print(f"tokentrail soak: {exc}", file=sys.stderr)
        return 2
    try:
        report = run_soak(config, log=lambda line: print(line, file=sys.stderr, flush=True))
    except TokentrailError as exc:
        print(f"tokentrail soak: {exc}", file=sys.stderr)
        return 1
    path = args.csv or config.run_dir / "soak.csv"
    write_csv(report, path)
    print(render(report, config))
    print(f"\nwall time {time.monotonic() - started:.1f} s; samples in {path}; logs in {config.run_dir}")
    failed = report.verdict(config)
    for line in failed:
        print(f"soak: FAILED: {line}", file=sys.stderr)
    return 1 if failed else 0


def render(report, config) -> str:
    from compose.tools.chaos.accounting import COUNTS
    from compose.tools.soak.run import SoakReport

    assert isinstance(report, SoakReport)
    out = ["  min  calls  p50 ms  p99 ms   lag  state keys  state KiB  delivered  " +
           "  ".join(f"{n} MiB/fd/thr" for n in ("policy", "interceptor", "processor", "consumer"))]
    for s in report.samples:
        procs = "  ".join(f"{p.rss_kib / 1024:6.0f}/{p.fds}/{p.threads}" for p in s.processes.values())
        out.append(f"{s.at_s / 60:5.1f}  {s.calls:5d}  {s.p50_ms:6.0f}  {s.p99_ms:6.0f}  {s.lag:4d}  {s.state_keys:10d}  "
                   f"{s.state_bytes / 1024:9.0f}  {s.rollouts:9d}  {procs}")
    out.append("")
    by_fault: dict[str, list] = {}
    for row in report.rows:
        by_fault.setdefault(row.fault, []).append(row)
    out.append(f"{'waves by fault':42} waves  rollouts  acked  " + "  ".join(COUNTS))
    for fault, rows in by_fault.items():
        counts = "  ".join(f"{sum(getattr(r, c) for r in rows):{len(c)}d}" for c in COUNTS)
        out.append(f"{fault:42} {len(rows):5d}  {sum(r.rollouts for r in rows):8d}  {sum(r.acked for r in rows):5d}  "
                   f"{counts}")
    growth = report.rss_growth(config.reference_s)
    out.append("")
    out.append(f"RSS growth from {config.reference_s / 60:.1f} min into each process's life to its last sample (<= "
               f"{config.rss_growth_max:.0%}): " + ", ".join(f"{n} {g:+.1%}" for n, g in growth.items()) +
               (f"; restarts {dict(report.starts)}" if report.starts else ""))
    keys, size = report.tombstones
    per = f", {size / keys:.0f} B per retired rollout" if keys else ""
    drained = f"{report.drained_s:.1f} s" if report.drained_s >= 0 else "NOT within the timeout"
    out.append(f"drain: {drained}; "
               f"live state {report.state_after[0]} keys / {report.state_after[1]} B (before the load "
               f"{report.state_before[0]} / {report.state_before[1]}); retired headers {keys} / {size} B{per}")
    out.append(f"delivered {report.delivered} rollouts; versions announced {len(report.announced)}; "
               f"verdict: {'PASS' if not report.verdict(config) else 'FAIL'}")
    return "\n".join(out)


def write_csv(report, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    names = sorted({n for s in report.samples for n in s.processes})
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["at_s", "calls", "p50_ms", "p99_ms", "lag", "state_keys", "state_bytes", "delivered",
                    *(f"{n}_{k}" for n in names for k in ("pid", "rss_kib", "fds", "threads"))])
        for s in report.samples:
            row = [f"{s.at_s:.1f}", s.calls, f"{s.p50_ms:.1f}", f"{s.p99_ms:.1f}", s.lag, s.state_keys, s.state_bytes,
                   s.rollouts]
            for n in names:
                p = s.processes.get(n)
                row += [p.pid, p.rss_kib, p.fds, p.threads] if p else ["", "", "", ""]
            w.writerow(row)
