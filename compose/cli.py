"""The `tokentrail` command: one subcommand per process or tool.

Each subcommand lives in the module that owns it; that module exposes
``configure(parser)`` (adds its arguments) and ``main(args) -> int``. Modules are
imported only when their subcommand runs, so `tokentrail kafka status` never
imports faust and `tokentrail policy` never imports confluent_kafka.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

from schemas.errors import TokentrailError

# subcommand -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "kafka": ("compose.rig.kafka.broker", "run a local Apache Kafka broker from Maven Central jars"),
    "policy": ("compose.engines.policy.cli", "run the vLLM-compatible reference policy server"),
    "intercept": ("producers.cli", "run the capture interceptor in front of a model server"),
    "finish": ("producers.finish_cli", "publish RolloutFinished for a rollout"),
    "token": ("producers.token_cli", "print a rollout's token, the API key its harness presents"),
    "process": ("processors.cli", "run the Faust fold processor"),
    "consume": ("consumers.cli", "rebuild finished rollouts and deliver them to a sink"),
    "replay": ("compose.ops.replay", "explain why rollouts were masked, from the event log"),
    "topics": ("compose.ops.topics", "create the tokentrail topics on a broker"),
    "versions": ("compose.ops.versions", "announce a policy version (the trainer), or show the announced ones"),
    "demo": ("compose.tools.demo", "bring the stack up, run sample rollouts, print the table"),
    "demo-async": ("compose.tools.async_demo.run", "rollouts on real vLLM CPU while a trainer pushes new weights"),
    "demo-trl": ("compose.tools.trl_demo.run", "TRL's GRPOTrainer trained on rollouts delivered through the stack"),
    "collect": ("compose.collect.cli", "run a harness over a task set, verify, deliver rewarded rollouts"),
    "bench": ("compose.tools.bench", "run a benchmark that prints figures"),
    "chaos": ("compose.tools.chaos.cli", "run concurrent rollouts while killing broker, processor, consumer, interceptor"),
    "soak": ("compose.tools.soak.cli", "an hour of rollouts with faults and announcements, sampled every minute"),
}


# subcommand -> the install extra it needs beyond the runtime, and the modules that extra brings.
# `pip install tokentrail` installs the runtime only (intercept, process, consume, ...).
EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "policy": ("engine", ("numpy",)),
    "collect": ("collect", ("numpy", "openai", "anthropic", "tqdm")),
    "demo": ("dev", ("numpy", "openai", "anthropic")),
    "demo-async": ("dev", ("numpy", "openai", "anthropic")),
    "demo-trl": ("dev", ("numpy", "openai", "anthropic")),
    "bench": ("dev", ("numpy", "openai", "anthropic")),
    "chaos": ("dev", ("numpy", "openai", "anthropic")),
    "soak": ("dev", ("numpy", "openai", "anthropic")),
}


class MissingExtra(TokentrailError):
    """A subcommand's install extra is not installed; the message names the pip command that adds it."""


def check_extra(command: str) -> None:
    """Raise `MissingExtra` if ``command`` needs an extra whose modules are not importable here."""
    extra, modules = EXTRAS.get(command, ("", ()))
    missing = [m for m in modules if not _installed(m)]
    if missing:
        raise MissingExtra(f"tokentrail {command} needs the [{extra}] extra (missing: {', '.join(missing)}): "
                           f"pip install 'tokentrail[{extra}]' (or `make install`, which installs everything)")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a finder that refuses it, or a broken install
        return False


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    """Build the parser; only the chosen subcommand's module is imported."""
    parser = argparse.ArgumentParser(prog="tokentrail", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sp = sub.add_parser(name, help=help_text, description=help_text)
        sp.set_defaults(_module=module_name)
        if name == chosen:
            check_extra(name)
            importlib.import_module(module_name).configure(sp)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = build_parser(argv).parse_args(argv)
    except MissingExtra as exc:
        print(f"tokentrail: {exc}", file=sys.stderr)
        return 2
    module = importlib.import_module(args._module)
    return int(module.main(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
