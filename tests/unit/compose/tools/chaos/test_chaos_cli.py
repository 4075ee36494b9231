"""``tokentrail chaos`` runs only on the broker it starts (and kills) itself: its help says so, and it takes
no --bootstrap or --kafka-config that would suggest otherwise."""

from __future__ import annotations

import argparse

from compose.cli import build_parser


def test_the_help_says_chaos_runs_only_on_its_own_plaintext_broker():
    parser = build_parser(["chaos"])
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    chaos = sub.choices["chaos"]
    text = chaos.format_help()
    assert "--kafka-config" in text and "PLAINTEXT broker it starts itself" in text
    assert not any(a.dest in ("bootstrap", "kafka_config") for a in chaos._actions)
