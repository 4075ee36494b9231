"""``tokentrail consume --max-staleness``: the current version moves under running rollouts, on the real stack.

The trainer announces v1..v3 (steps 1..3) on the policy-versions topic and tells the
interceptor each time (its admin route): every call records the version current when
it ran. Rollouts run while the version moves (B and C have calls on both sides of an
update, E ran under a label nobody announced), then all finish, and only then does
a consumer with ``--max-staleness 1`` start: each rollout is judged against v3. A and
B (oldest token v1, 2 behind) are masked ``stale_policy`` and nothing else is; E is
``unknown_policy_version``; a second consumer with ``--stale-action drop`` delivers
the same set minus A and B, and says so in its log; ``tokentrail replay --summary
--max-staleness 1`` rebuilds the same decisions from the log, with the histogram.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from typing import Any

import httpx
import openai
import pytest

from compose.harnesses.sdk import WEATHER_TOOL, weather_tool
from compose.rig.stack import LocalStack
from schemas.kafka.announce import announce_version

pytestmark = [pytest.mark.integration, pytest.mark.real_broker]


@pytest.fixture(scope="module")
def versions_stack(kafka_bootstrap, tmp_path_factory):
    tag = uuid.uuid4().hex[:8]
    with LocalStack(kafka_bootstrap, tmp_path_factory.mktemp("stale"), topic_prefix=f"st{tag}.",
                    processor_id=f"st{tag}", with_pipeline=False,
                    consumer_args=("--max-staleness", "1", "--log-level", "INFO")) as stack:
        stack.add_processor("processor")
        yield stack


class Conversation:
    """One tool-using rollout driven a call at a time (the reference server calls the tool ``tool_calls`` times)."""

    def __init__(self, stack: LocalStack, rollout_id: str, tool_calls: int) -> None:
        self.stack, self.rollout_id = stack, rollout_id
        self.client = openai.OpenAI(base_url=stack.capture_base_url(rollout_id), api_key="not-needed",
                                    max_retries=0, timeout=60)
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": f"You are a helpful agent. #tool-calls={tool_calls}"},
            {"role": "user", "content": f"weather for {rollout_id}?"}]
        self.last_id = ""
        self.final_text: str | None = None

    def call(self) -> None:
        response = self.client.chat.completions.create(model="tokentrail-policy", messages=self.messages,
                                                       tools=[WEATHER_TOOL])
        self.last_id = response.id
        message = response.choices[0].message
        self.messages.append(message.model_dump(exclude_none=True))
        for n, call in enumerate(message.tool_calls or []):
            self.messages.append({"role": "tool", "tool_call_id": call.id,
                                  "content": weather_tool(call.function.name, json.loads(call.function.arguments), n)})
        if not message.tool_calls:
            self.final_text = message.content

    def finish(self) -> None:
        assert self.final_text is not None, f"{self.rollout_id} has no final answer yet"
        self.stack.finish(self.rollout_id, {"reward": 1.0}, final_response_id=self.last_id,
                          final_text=self.final_text)


def test_max_staleness_masks_exactly_the_rollouts_whose_oldest_token_is_too_old(versions_stack, kafka_bootstrap,
                                                                                 capsys):
    stack = versions_stack
    topic = stack.topics.policy_versions

    def move_to(label: str, step: int | None) -> None:
        if step is not None:  # announced: the consumer's book knows it
            announce_version(kafka_bootstrap, label, step, topic=topic)
        r = httpx.post(f"{stack.interceptor_url}/tokentrail/admin/policy-version", json={"version": label},
                       headers={"authorization": f"Bearer {stack.control_token}"}, timeout=30)
        r.raise_for_status()

    tag = uuid.uuid4().hex[:6]
    a, b, c, d, e = (Conversation(stack, f"st-{tag}-{n}", tool_calls=k)
                     for n, k in (("a", 0), ("b", 1), ("c", 1), ("d", 0), ("e", 0)))
    move_to("v1", 1)
    a.call()
    b.call()  # b's first call under v1 ...
    move_to("v2", 2)
    b.call()  # ... its second under v2: its oldest token is v1
    c.call()
    move_to("v3", 3)
    c.call()  # c: v2 then v3
    d.call()
    move_to("rogue", None)  # a label the trainer never announced
    e.call()
    move_to("v3", 3)
    for conversation in (a, b, c, d, e):
        conversation.finish()

    stack.add_consumer("consumer", sink_path=stack.rollouts_path)
    ids = {n: conv.rollout_id for n, conv in zip("abcde", (a, b, c, d, e))}
    got = stack.wait_rollouts(list(ids.values()), timeout=120)
    by = {n: got[rid] for n, rid in ids.items()}
    masked = {n for n, record in by.items() if record["mask_sample"]}
    assert masked == {"a", "b", "e"}, {n: record["mask_reasons"] for n, record in by.items()}
    assert [r["code"] for r in by["a"]["mask_reasons"]] == ["stale_policy"]
    assert [r["code"] for r in by["b"]["mask_reasons"]] == ["stale_policy"]
    assert [r["code"] for r in by["e"]["mask_reasons"]] == ["unknown_policy_version"]
    reason = by["b"]["mask_reasons"][0]
    assert "staleness 2 > max_staleness=1" in reason["detail"] and "'v1'" in reason["detail"]
    assert reason["call_ids"] == [by["b"]["trajectory"]["spans"][0]["model_call_id"]]  # the call under v1
    staleness = {n: by[n]["_ng_token_capture"]["policy_staleness"] for n in "abcde"}
    assert staleness == {"a": 2, "b": 2, "c": 1, "d": 0, "e": None}
    assert {by[n]["_ng_token_capture"]["current_policy_version"] for n in "abcd"} == {"v3"}
    assert by["c"]["_ng_token_capture"]["oldest_policy_version"] == "v2"

    # The same rollouts through a consumer that drops stale ones: every other one delivered as before.
    stack.consumer_args = ("--max-staleness", "1", "--stale-action", "drop", "--log-level", "INFO")
    dropping = stack.run_dir / "dropping.jsonl"
    stack.add_consumer("dropping", group_id=f"{stack.processor_id}-dropping", sink_path=dropping)
    for n in "ab":
        stack.wait_log("dropping", f"dropped stale rollout {ids[n]}", timeout=120)
    kept = {ids[n] for n in "cde"}
    assert _delivered(stack, dropping, kept) & set(ids.values()) == kept


    # Replay rebuilds the same rollouts from the log and judges them at their freeze (all after v3).
    summary = _replay_summary(kafka_bootstrap, stack.topic_prefix, capsys)
    assert summary["staleness"]["histogram"] == {"0": 1, "1": 1, "2": 2}
    assert (summary["staleness"]["unknown"], summary["staleness"]["stale"]) == (1, 2)
    assert summary["by_reason"] == {"stale_policy": 2, "unknown_policy_version": 1}


def _replay_summary(bootstrap: str, prefix: str, capsys) -> dict:
    from consumers.replay import cli

    parser = argparse.ArgumentParser()
    cli.configure(parser)
    capsys.readouterr()
    code = cli.main(parser.parse_args(["--bootstrap", bootstrap, "--summary", "--format", "json",
                                       "--max-staleness", "1", "--topic-prefix", prefix]))
    assert code == 0
    return json.loads(capsys.readouterr().out)


def _delivered(stack: LocalStack, path, wanted: set[str], timeout: float = 60.0) -> set[str]:
    """The rollout ids in the JSONL file ``path`` once it holds all of ``wanted`` (or at the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        found = {json.loads(line)["rollout_id"] for line in path.read_text().splitlines()} if path.exists() else set()
        if wanted <= found or time.monotonic() > deadline:
            return found
        stack.check_alive()
        time.sleep(0.2)
