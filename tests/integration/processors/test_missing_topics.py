"""A real `tokentrail process` worker started before its topics exist, on the real broker.

It must not wait for ever (Faust alone logs "Ignoring missing topic" and idles):
it exits 4 within its ``--topic-wait``, naming the missing topics and the
`tokentrail topics` command, and creates nothing; that very command then makes
the next start work. Topics created while it waits are picked up.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid

import pytest
from confluent_kafka.admin import AdminClient

from schemas.codec import decode_snapshot, encode_event
from schemas.kafka.admin import ensure_topics
from tests.factories import event, finished, make_call
from tests.integration.processors.harness import REPO, FoldWorker, TopicReader, log_report, publish, topic_names_for

pytestmark = [pytest.mark.integration, pytest.mark.real_broker]


def topics_with(bootstrap: str, prefix: str) -> set[str]:
    return {t for t in AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics
            if t.startswith(prefix)}


def run_printed_command(log: str) -> str:
    """Run the `tokentrail topics ...` command the message printed; return it."""
    match = re.search(r"`(tokentrail topics [^`]+)`", log)
    assert match, log
    command = match.group(1)
    args = command.split()[1:]
    out = subprocess.run([sys.executable, "-m", "compose.cli", *args], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return command


def test_process_exits_4_naming_the_missing_topics_then_the_printed_command_fixes_it(kafka_bootstrap, tmp_path):
    prefix = f"itm{uuid.uuid4().hex[:8]}."
    names = topic_names_for(prefix)
    worker = FoldWorker(kafka_bootstrap, tmp_path, "w", app_id=f"{prefix}proc", prefix=prefix,
                        extra_args=("--topic-wait", "3"))
    start = time.monotonic()
    worker.start()
    try:
        rc = worker.proc.wait(60)
    except subprocess.TimeoutExpired as exc:
        worker.kill9()
        raise AssertionError(f"the worker kept running without its topics:\n{worker.log_text()[-3000:]}") from exc
    elapsed = time.monotonic() - start
    text = worker.log_text()
    assert rc == 4, text
    assert elapsed < 45, f"took {elapsed:.1f} s"
    assert f"tokentrail process: missing Kafka topics on {kafka_bootstrap} after waiting 3 s:" in text
    for topic in (names.rollout_events, names.snapshots, names.deadletter):
        assert topic in text
    assert f"`tokentrail topics --bootstrap {kafka_bootstrap} --topic-prefix {prefix}`" in text
    assert "Traceback" not in text and "Ignoring missing topic" not in text
    assert topics_with(kafka_bootstrap, prefix) == set(), "the worker created topics"
    assert not worker.data_dir.exists(), "the worker claimed its data dir before exiting"

    run_printed_command(text)
    assert topics_with(kafka_bootstrap, prefix) >= {names.rollout_events, names.snapshots, names.deadletter}
    worker.start()
    reader = TopicReader(kafka_bootstrap, names.snapshots)
    try:
        worker.wait_for("Worker ready", timeout=90)
        rid = f"mt-{uuid.uuid4().hex[:6]}"
        publish(kafka_bootstrap, names.rollout_events,
                [(rid.encode(), encode_event(event(rid, make_call([1, 2], [3])))),
                 (rid.encode(), encode_event(event(rid, finished())))])
        reader.wait(lambda recs: any(r.key == rid.encode() for r in recs), 90, f"a snapshot of {rid}",
                    alive=lambda: None if worker.proc.poll() is None else pytest.fail(log_report(worker.log_text())))
        snap = decode_snapshot(next(r.value for r in reader.records if r.key == rid.encode()))
        assert snap.rollout_id == rid and len(snap.calls) == 1
    finally:
        reader.close()
        assert worker.stop() == 0, worker.log_text()[-3000:]


def test_process_picks_up_topics_created_while_it_waits(kafka_bootstrap, tmp_path):
    prefix = f"itw{uuid.uuid4().hex[:8]}."
    worker = FoldWorker(kafka_bootstrap, tmp_path, "w", app_id=f"{prefix}proc", prefix=prefix,
                        extra_args=("--topic-wait", "60"))
    worker.start()
    try:
        time.sleep(2)
        assert worker.proc.poll() is None, worker.log_text()
        ensure_topics(kafka_bootstrap, topic_names_for(prefix))
        worker.wait_for("Worker ready", timeout=90)
    finally:
        assert worker.stop() == 0, worker.log_text()[-3000:]
