"""``tokentrail bench <name>``: benchmarks that print figures (never timed tests).

Each benchmark is a module ``compose.tools.bench.<name>`` exposing ``configure(parser)``
and ``main(args) -> int``; it prints its figures and, where the budget names a
baseline, the ratio against that baseline measured in the same run.

The benchmarks that reach a broker given by ``--bootstrap`` (``e2e``, ``interceptor``, ``scaleout``,
``fold``) take ``--kafka-config`` for it (``compose.rig.stack.kafka_configs_of_args``): an invalid file
exits 2 here, naming the key, before anything starts.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil


def _benchmarks() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench", required=True, metavar="BENCHMARK")
    for name in _benchmarks():
        module = importlib.import_module(f"compose.tools.bench.{name}")
        summary = (module.__doc__ or "").strip().splitlines()[0]
        sp = sub.add_parser(name, help=summary.replace("%", "%%"))  # argparse formats help strings
        module.configure(sp)
        sp.set_defaults(_bench_module=module)


def main(args: argparse.Namespace) -> int:
    import sys

    from schemas.kafka.security import KafkaConfigError

    try:
        return int(args._bench_module.main(args) or 0)
    except KafkaConfigError as exc:
        print(f"tokentrail bench {args.bench}: {exc}", file=sys.stderr)
        return 2
