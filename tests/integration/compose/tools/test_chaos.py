"""Chaos under load, small: 8 concurrent rollouts through real processes on a real broker, while the
processor is killed -9 once and the consumer is killed once between deliver and retire.

Every acknowledged call must be delivered exactly once, and every record must equal the clean
run's (``compose.tools.chaos.accounting``); `make chaos` runs the full version (64 rollouts, every fault).
"""

from __future__ import annotations

import pytest

from compose.tools.chaos.accounting import COUNTS, failing, render
from compose.tools.chaos.run import ChaosConfig, run_chaos

pytestmark = [pytest.mark.integration, pytest.mark.real_broker]


def test_processor_and_consumer_kills_under_load_lose_duplicate_and_change_nothing(kafka_bootstrap, tmp_path):
    config = ChaosConfig(run_dir=tmp_path / "chaos", rollouts=8, faults=("processor", "consumer"),
                         processor_kills=1, consumer_kills=1, bootstrap=kafka_bootstrap)
    rows = run_chaos(config, log=lambda line: None)
    table = render(rows)
    assert [row.fault.split()[0] for row in rows] == ["none", "(b)", "(c)"], table
    assert all(row.rollouts == 8 and row.acked == sum(2 + i % 3 for i in range(8)) for row in rows), table
    assert not failing(rows), table
    assert all(getattr(row, count) == 0 for row in rows for count in COUNTS), table
    # the faults really happened: one processor kill, one consumer kill after a durable delivery
    processor, consumer = rows[1], rows[2]
    assert "1 kills at calls" in processor.note and "unplanned" not in processor.note, table
    assert "1 kills after deliveries" in consumer.note and "unplanned" not in consumer.note, table
    assert (config.run_dir / "sink.count").read_text() == str(4 * 8)  # clean, repeat, (b), (c): each rollout written once
