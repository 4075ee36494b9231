"""The fuzz tier's one home: how many examples each fuzz test runs, and the counts it reports.

Fuzz tests (marked ``fuzz``) draw their inputs with Hypothesis under ``settings(fuzz_settings())``:
``TOKENTRAIL_FUZZ_EXAMPLES`` examples each (default 200: the fast tier inside ``make test``;
``make fuzz`` runs 10,000), no deadline (a 2-core machine under load), no example database (a
run is reproducible from its seed, ``--hypothesis-seed``). Each test counts what happened to
its inputs in ``COUNTS[test name][outcome]`` (``count``); the terminal summary prints every
count, so a run shows how many inputs reached each outcome (``4xx invalid_request`` ...), not
only that nothing failed.
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict

from hypothesis import HealthCheck, settings

__all__ = ["COUNTS", "count", "fuzz_examples", "fuzz_settings"]

COUNTS: defaultdict[str, Counter[str]] = defaultdict(Counter)


def fuzz_examples() -> int:
    raw = os.environ.get("TOKENTRAIL_FUZZ_EXAMPLES", "200")
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"TOKENTRAIL_FUZZ_EXAMPLES={raw!r} must be a positive integer, e.g. 10000") from None
    if n < 1:
        raise ValueError(f"TOKENTRAIL_FUZZ_EXAMPLES={raw!r} must be a positive integer, e.g. 10000")
    return n


def fuzz_settings(**overrides) -> settings:
    return settings(max_examples=fuzz_examples(), deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.data_too_large, HealthCheck.filter_too_much],
                    **overrides)


def count(test: str, outcome: str) -> None:
    COUNTS[test][outcome] += 1
