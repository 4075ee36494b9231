"""The worker's startup topic check: a bounded wait, then a message naming the missing topics (no broker).

`schemas.kafka.topics.wait_for_topics` is the one rule both runtime processes use; it is
driven here with a fake admin client and a fake clock, and the `process` command
against an address where no broker listens must exit 4 within its wait.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from processors.app import check_topics, required_topics
from processors.settings import ProcessorSettings
from schemas.kafka.topics import TopicsUnavailable, topic_names, topic_prefix, topics_command, wait_for_topics

REPO = Path(__file__).resolve().parents[3]


@dataclass
class Meta:
    error: object = None


@dataclass
class Metadata:
    topics: dict
    brokers: dict = field(default_factory=lambda: {1: "b"})


class FakeAdmin:
    """Answers `list_topics` from a script: each entry is a set of topic names, a Metadata, or an exception."""

    def __init__(self, *answers) -> None:
        self.answers = list(answers)
        self.calls: list[float] = []

    def list_topics(self, timeout: float):
        self.calls.append(timeout)
        answer = self.answers[0] if len(self.answers) == 1 else self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        if isinstance(answer, Metadata):
            return answer
        return Metadata({name: Meta() for name in answer})


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 0.01)


NAMES = topic_names("t1.")
ALL = {NAMES.rollout_events, NAMES.snapshots, NAMES.rebuilt, NAMES.deadletter}


def wait(admin, required, timeout=5.0, **kw):
    clock = FakeClock()
    wait_for_topics(admin, required, bootstrap="127.0.0.1:9092", names=NAMES, timeout=timeout,
                    sleep=clock.sleep, clock=clock, **kw)
    return clock


def test_returns_at_once_when_every_topic_exists():
    admin = FakeAdmin(ALL)
    clock = wait(admin, [NAMES.rollout_events, NAMES.snapshots])
    assert len(admin.calls) == 1 and clock.now == 0.0


def test_waits_for_topics_that_appear_within_the_wait():
    admin = FakeAdmin(set(), {NAMES.rollout_events}, ALL)
    wait(admin, [NAMES.rollout_events, NAMES.snapshots])
    assert len(admin.calls) == 3


def test_a_topic_whose_metadata_carries_an_error_is_not_there_yet():
    not_ready = Metadata({NAMES.rollout_events: Meta(error="LEADER_NOT_AVAILABLE")})
    with pytest.raises(TopicsUnavailable) as info:
        wait(FakeAdmin(not_ready), [NAMES.rollout_events], timeout=1.0)
    assert info.value.missing == (NAMES.rollout_events,)
    assert f"{NAMES.rollout_events} (LEADER_NOT_AVAILABLE)" in str(info.value)


def test_missing_topics_are_named_with_the_command_that_creates_them():
    with pytest.raises(TopicsUnavailable) as info:
        wait(FakeAdmin({NAMES.snapshots}), [NAMES.rollout_events, NAMES.snapshots, NAMES.deadletter], timeout=2.0)
    message = str(info.value)
    assert info.value.missing == (NAMES.rollout_events, NAMES.deadletter)
    assert f"{NAMES.rollout_events}, {NAMES.deadletter}" in message and NAMES.snapshots + "," not in message
    assert "`tokentrail topics --bootstrap 127.0.0.1:9092 --topic-prefix t1.`" in message
    assert "after waiting 2 s" in message


def test_the_wait_is_bounded_by_its_timeout():
    admin = FakeAdmin(set())
    with pytest.raises(TopicsUnavailable):
        clock = FakeClock()
        try:
            wait_for_topics(admin, [NAMES.snapshots], bootstrap="h:1", names=NAMES, timeout=3.0,
                            sleep=clock.sleep, clock=clock)
        finally:
            assert 3.0 <= clock.now < 3.3
    assert all(0.1 <= t <= 2.0 for t in admin.calls)


def test_a_zero_wait_asks_once():
    admin = FakeAdmin(set())
    with pytest.raises(TopicsUnavailable):
        wait(admin, [NAMES.snapshots], timeout=0)
    assert len(admin.calls) == 1


def test_no_broker_answering_is_its_own_message():
    with pytest.raises(TopicsUnavailable) as info:
        wait(FakeAdmin(RuntimeError("KafkaError{code=_TRANSPORT}")), [NAMES.snapshots], timeout=1.0)
    message = str(info.value)
    assert message.startswith("no Kafka broker answered at 127.0.0.1:9092 within 1 s")
    assert "_TRANSPORT" in message and "tokentrail topics --bootstrap 127.0.0.1:9092 --topic-prefix t1." in message
    # metadata without brokers is no answer either
    with pytest.raises(TopicsUnavailable, match="no Kafka broker answered"):
        wait(FakeAdmin(Metadata({}, brokers={})), [NAMES.snapshots], timeout=1.0)


def test_topics_the_command_does_not_create_are_called_out():
    with pytest.raises(TopicsUnavailable) as info:
        wait(FakeAdmin(set()), [NAMES.snapshots, "trainer.rebuilt"], timeout=0)
    assert "create trainer.rebuilt yourself" in str(info.value)


def test_command_carries_prefix_and_a_non_default_partition_count():
    assert topics_command("h:1", topic_names()) == "tokentrail topics --bootstrap h:1"
    assert topics_command("h:1", topic_names("a."), partitions=8) == (
        "tokentrail topics --bootstrap h:1 --topic-prefix a. --partitions 8")
    assert topics_command("h:1", topic_names("a."), partitions=4) == "tokentrail topics --bootstrap h:1 --topic-prefix a."
    assert topic_prefix(topic_names("x-")) == "x-" and topic_prefix(topic_names()) == ""
    from dataclasses import replace

    assert topic_prefix(replace(topic_names("x-"), snapshots="other")) is None


def test_the_worker_needs_its_input_and_both_outputs():
    settings = ProcessorSettings(bootstrap="h:1", topics=NAMES)
    assert required_topics(settings) == [NAMES.rollout_events, NAMES.snapshots, NAMES.deadletter]


def test_check_topics_names_the_workers_partition_count_in_the_command():
    settings = ProcessorSettings(bootstrap="h:1", topics=NAMES, partitions=8, topic_wait_s=0)
    with pytest.raises(TopicsUnavailable) as info:
        check_topics(settings, admin=FakeAdmin({NAMES.snapshots}))
    assert info.value.missing == (NAMES.rollout_events, NAMES.deadletter)
    assert "tokentrail topics --bootstrap h:1 --topic-prefix t1. --partitions 8" in str(info.value)
    check_topics(settings, admin=FakeAdmin(ALL))  # all there: returns


def test_process_without_a_broker_exits_4_within_its_wait(tmp_path):
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "compose.cli", "process", "--bootstrap", "127.0.0.1:1", "--data-dir",
         str(tmp_path / "data"), "--topic-prefix", "nb.", "--topic-wait", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 4, out.stderr
    assert "tokentrail process: no Kafka broker answered at 127.0.0.1:1 within 1 s" in out.stderr
    assert "tokentrail topics --bootstrap 127.0.0.1:1 --topic-prefix nb." in out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "data").exists()  # exited before claiming a data dir
    assert time.monotonic() - start < 30
