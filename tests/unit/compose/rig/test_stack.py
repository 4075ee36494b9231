"""The local stack's reading of its JSONL sink and the flags it gives its services (no processes started)."""

from __future__ import annotations

import json

from compose.rig.stack import LocalStack, read_delivered


def test_a_line_the_sink_is_still_writing_is_left_for_the_next_read(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    assert read_delivered(path) == []
    whole = [{"rollout_id": "a", "n": 1}, {"rollout_id": "b", "n": 2}]
    text = "".join(json.dumps(r) + "\n" for r in whole)
    path.write_text(text + '{"rollout_id": "c", "log_probs": [-0.5, -1.2')  # mid-write of a large record
    assert read_delivered(path) == whole
    path.write_text(text + json.dumps({"rollout_id": "c"}) + "\n")
    assert [r["rollout_id"] for r in read_delivered(path)] == ["a", "b", "c"]


def test_fold_workers_and_consumers_wait_the_stacks_broker_wait(tmp_path, monkeypatch):
    spawned: dict[str, tuple[str, ...]] = {}
    monkeypatch.setattr(LocalStack, "_spawn", lambda self, name, *argv, **_: spawned.setdefault(name, argv))
    stack = LocalStack("127.0.0.1:9", tmp_path, topic_wait_s=45.0)
    stack.add_processor("processor", wait=False)
    stack.add_consumer("consumer")
    for name in ("processor", "consumer"):
        argv = spawned[name]
        assert argv[argv.index("--topic-wait") + 1] == "45.0", argv
