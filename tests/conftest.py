"""Session-wide test fixtures: one Kafka broker for the whole run, started only on demand.

`kafka_bootstrap` picks the first broker available, in this order (ARCHITECTURE §7):
``KAFKA_BOOTSTRAP`` from the environment ("external"); testcontainers when a Docker
engine answers ("testcontainers"); Apache Kafka from Maven Central jars ("jar"); the
librdkafka mock cluster only as a last resort ("mock"). Nothing starts unless a test
asks for it, so unit tests never pay for a broker. Tests marked ``real_broker`` are
skipped with a visible reason on the mock, never silently passed, and the terminal
summary says which broker ran, how long it took to start and what was skipped.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class KafkaBroker:
    flavor: str  # "external" | "testcontainers" | "jar" | "mock"
    bootstrap: str
    startup_s: float
    detail: str  # what ran, or why a better flavor was not available


_SESSION: dict = {"broker": None, "skipped_real": []}  # read by the terminal summary


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "real_broker: needs a real Kafka broker; skipped, with the reason shown, "
        "when the session runs on the librdkafka mock")
    config.addinivalue_line(
        "markers", "fuzz: property-based fuzzing (tests/fuzzing.py); TOKENTRAIL_FUZZ_EXAMPLES each, "
        "200 in make test, 10,000 in make fuzz")


@pytest.fixture(scope="session")
def kafka_session_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """The session's broker (see the module docstring for the order of choice)."""
    start = time.monotonic()
    if bootstrap := os.environ.get("KAFKA_BOOTSTRAP"):
        yield _record(KafkaBroker("external", bootstrap, 0.0, "KAFKA_BOOTSTRAP"))
    elif _docker_answers():
        yield from _testcontainers_broker(start)
    elif (why_not_jar := _jar_unavailable()) is None:
        yield from _jar_broker(tmp_path_factory.mktemp("kafka"), start)
    else:
        yield from _mock_broker(start, why_not_jar)


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_session_broker: KafkaBroker) -> str:
    """Bootstrap servers of the session's broker, e.g. ``127.0.0.1:40123``."""
    return kafka_session_broker.bootstrap


@pytest.fixture(scope="session")
def kafka_flavor(kafka_session_broker: KafkaBroker) -> str:
    """"external", "testcontainers", "jar" or "mock"."""
    return kafka_session_broker.flavor


@pytest.fixture(autouse=True)
def _real_broker_gate(request: pytest.FixtureRequest) -> None:
    # Only marked tests touch the broker fixture here, so unmarked tests stay broker-free.
    if request.node.get_closest_marker("real_broker") is None:
        return
    broker: KafkaBroker = request.getfixturevalue("kafka_session_broker")
    if broker.flavor == "mock":
        _SESSION["skipped_real"].append(request.node.nodeid)
        pytest.skip(f"needs a real Kafka broker; this run has only the librdkafka mock "
                    f"({broker.detail})")


_INTEGRATION = "tests/integration/"
# Integration modules with no real-vLLM test and no timing they depend on (the collector over the stand-in and
# the remote agent; the jar broker's own life cycle): each is a unit of work of its own, which the unit tier's
# worker takes, so ~110 s leave the integration tier's line.
_BESIDE = ("tests/integration/collect/test_collect_remote_and_local.py",
           "tests/integration/compose/rig/test_kafka_broker_live.py")


def _scope(nodeid: str) -> str:
    """The unit of work a test belongs to under xdist: the integration tier, a module beside it, or itself."""
    module = nodeid.split("::", 1)[0]
    if module in _BESIDE:
        return module
    return _INTEGRATION if nodeid.startswith(_INTEGRATION) else nodeid


def _xdist_worker() -> bool:
    return "PYTEST_XDIST_WORKER" in os.environ


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The real-vLLM tier runs last, as a block: its session engine (two processes on 2 cores)
    # then never competes with the timing-sensitive processor and broker tests.
    items.sort(key=lambda item: item.get_closest_marker("vllm") is not None)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's
def pytest_xdist_make_scheduler(config: pytest.Config, log):  # type: ignore[no-untyped-def]
    """Under pytest-xdist (`make test`: -n 2) the integration tier is one unit of work: one worker runs it, in
    the order above, with its session broker and engines; the unit tier and the ``_BESIDE`` modules run beside
    it on the other worker, where the single-threaded run left a core mostly idle while tests waited on Kafka. (xdist's own
    ``--dist loadgroup`` cannot say so under pytest 9: it renames ``_nodeid``, which pytest 9 no longer reads.)"""
    from xdist.scheduler import LoadScopeScheduling

    class IntegrationAsOneScope(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

    return IntegrationAsOneScope(config, log)


def pytest_collection_finish(session: pytest.Session) -> None:
    # The real-vLLM engines the selected tests need start now, in the background, on the core the
    # single-threaded tiers before them leave idle (tests/integration/warm_engines.py). Under xdist every
    # worker collects every test: the engines start with the first integration test a worker runs
    # (pytest_runtest_setup), and mypy when its test asks.
    if session.config.option.collectonly or _xdist_worker():
        return
    if any(item.nodeid.endswith("test_lint.py::test_mypy_finds_nothing") for item in session.items):
        from tests.unit.lint_jobs import start_mypy

        start_mypy()  # a cold mypy run overlaps the tests before it
    _prewarm(session.items)


def _prewarm(items: list[pytest.Item]) -> None:
    if any(item.get_closest_marker("vllm") is not None for item in items):
        from tests.integration.warm_engines import engines_needed, prewarm

        prewarm(engines_needed(items))


_WARMED: list[bool] = []


def pytest_runtest_setup(item: pytest.Item) -> None:
    if _xdist_worker() and not _WARMED and _scope(item.nodeid) == _INTEGRATION:
        _WARMED.append(True)
        _prewarm(item.session.items)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    warm = sys.modules.get("tests.integration.warm_engines")
    if warm is not None:
        warm.stop_all()


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    from tests.fuzzing import COUNTS, fuzz_examples

    if COUNTS:
        terminalreporter.write_sep("-", f"fuzz counts ({fuzz_examples()} examples per test)")
        for test, outcomes in sorted(COUNTS.items()):
            total = sum(outcomes.values())
            parts = ", ".join(f"{outcome} {n}" for outcome, n in sorted(outcomes.items(), key=lambda kv: -kv[1]))
            terminalreporter.write_line(f"{test}: {total} inputs: {parts}")
    broker: KafkaBroker | None = _SESSION["broker"]
    if broker is None:
        return
    terminalreporter.write_sep("-", "kafka broker")
    terminalreporter.write_line(f"flavor {broker.flavor} at {broker.bootstrap}, ready in "
                                f"{broker.startup_s:.1f} s ({broker.detail})")
    if skipped := _SESSION["skipped_real"]:
        terminalreporter.write_line(f"{len(skipped)} real_broker test(s) SKIPPED on the mock:")
        for nodeid in skipped:
            terminalreporter.write_line(f"  {nodeid}")


def _record(broker: KafkaBroker) -> KafkaBroker:
    _SESSION["broker"] = broker
    return broker


# ---------------------------------------------------------------- flavors

def _docker_answers() -> bool:
    """True if a Docker engine answers a ping within about a second."""
    if not os.environ.get("DOCKER_HOST") and not Path("/var/run/docker.sock").exists():
        return False  # the common case here: no engine, and no need to import docker
    try:
        import docker

        client = docker.from_env(timeout=2)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # any failure to reach the engine means "no Docker"
        return False


def _testcontainers_broker(start: float) -> Iterator[KafkaBroker]:
    from testcontainers.community.kafka import KafkaContainer

    container = (KafkaContainer("confluentinc/cp-kafka:7.6.0").with_kraft()
                 .with_env("KAFKA_MESSAGE_MAX_BYTES", "16777216")
                 .with_env("KAFKA_REPLICA_FETCH_MAX_BYTES", "16777216")
                 .with_env("KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS", "0"))
    with container:
        yield _record(KafkaBroker("testcontainers", container.get_bootstrap_server(),
                                  time.monotonic() - start, "confluentinc/cp-kafka:7.6.0, KRaft"))


def _jar_unavailable() -> str | None:
    """None if the jar broker can run; else why not (java missing, jars not obtainable)."""
    from compose.rig.kafka.broker import BrokerError, ensure_jars, find_java

    try:
        find_java()
        ensure_jars()
    except BrokerError as exc:
        return str(exc).splitlines()[0]
    return None


def _jar_broker(state_dir: Path, start: float) -> Iterator[KafkaBroker]:
    from compose.rig.kafka.broker import start_broker, stop_broker

    # Java and the jars are there, so a failure to start is a bug to see, not a reason to
    # fall back to the mock: BrokerError propagates and fails the tests that asked.
    info = start_broker(state_dir)
    try:
        yield _record(KafkaBroker(
            "jar", info.bootstrap, time.monotonic() - start,
            f"Apache Kafka {info.kafka_version} pid {info.pid}, JVM launch to ready "
            f"{info.startup_s:.1f} s, log {state_dir / 'broker.log'}"))
    finally:
        stop_broker(state_dir)


# The mock cluster lives exactly as long as the producer handle that created it, so it
# runs in a helper process that holds the handle until its stdin closes.
_MOCK_HOLDER = """
import sys
from confluent_kafka import Producer
p = Producer({"test.mock.num.brokers": 1})
md = p.list_topics(timeout=10)
print(",".join(f"{b.host}:{b.port}" for b in md.brokers.values()), flush=True)
sys.stdin.read()
"""


def _mock_broker(start: float, why_not_jar: str) -> Iterator[KafkaBroker]:
    proc = subprocess.Popen([sys.executable, "-c", _MOCK_HOLDER], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        bootstrap = (proc.stdout.readline() if proc.stdout else "").strip()
        if not bootstrap:
            raise RuntimeError("the librdkafka mock cluster did not start")
        yield _record(KafkaBroker("mock", bootstrap, time.monotonic() - start,
                                  f"librdkafka mock cluster; no jar broker: {why_not_jar}"))
    finally:
        if proc.stdin:
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
