"""``tokentrail chaos``: 64 concurrent rollouts under each fault; one table; exit 1 unless every count is 0.

Prints one row per fault (and the clean repeat, and a total): acknowledged calls lost,
duplicated, rollouts delivered unmasked that lost a call, records that differ from a clean
run (``compose.tools.chaos.accounting`` says exactly what each counts), then each phase's note
(what was injected, its wall time, any service that exited unannounced) and every problem
found, naming the rollout. Exit 0 only when all four columns are zero in every row.

Kafka: chaos runs only against the broker it starts itself under ``--run-dir`` (PLAINTEXT; it kills
and restarts it), so it takes neither ``--bootstrap`` nor ``--kafka-config``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from compose.tools.chaos.faults import FAULTS

__all__ = ["configure", "main"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = ("Kafka: chaos runs only against the PLAINTEXT broker it starts itself under --run-dir (it kills "
                     "and restarts it): it takes neither --bootstrap nor --kafka-config.")
    parser.add_argument("--rollouts", type=int, default=64, help="concurrent rollouts per phase (default 64)")
    parser.add_argument("--faults", default=",".join(FAULTS),
                        help=f"comma-separated faults to run, in order (default: all of {','.join(FAULTS)})")
    parser.add_argument("--processor-kills", type=int, default=5, help="kill -9 of the processor (default 5)")
    parser.add_argument("--consumer-kills", type=int, default=3,
                        help="consumer kills between deliver and retire (default 3)")
    parser.add_argument("--broker-down-s", type=float, default=6.0, help="seconds the broker stays dead (default 6)")
    parser.add_argument("--run-dir", type=Path, default=Path(".tokentrail/chaos"),
                        help="logs, spool, sink file and the run's own broker (wiped at start)")


def main(args: argparse.Namespace) -> int:
    from compose.tools.chaos.accounting import failing, render
    from compose.tools.chaos.run import ChaosConfig, run_chaos
    from schemas.errors import TokentrailError

    faults = tuple(f.strip() for f in args.faults.split(",") if f.strip())
    started = time.monotonic()
    try:
        config = ChaosConfig(run_dir=args.run_dir.resolve(), rollouts=args.rollouts, faults=faults,
                             processor_kills=args.processor_kills, consumer_kills=args.consumer_kills,
                             broker_down_s=args.broker_down_s)
        rows = run_chaos(config, log=lambda line: print(line, file=sys.stderr, flush=True))
    except TokentrailError as exc:
        print(f"tokentrail chaos: {exc}", file=sys.stderr)
        return 2
    print(render(rows))
    print(f"\nwall time {time.monotonic() - started:.1f} s; logs in {config.run_dir}")
    if failing(rows):
        print("chaos: FAILED (a count above is not zero)", file=sys.stderr)
        return 1
    return 0
