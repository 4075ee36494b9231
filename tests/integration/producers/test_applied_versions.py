"""Labels that never lag (issue 25), on a real broker and the stand-in engine.

``tokentrail versions announce`` returns only once every live interceptor reported it applied the
version (``schemas.version_reports``), so a trainer that resumes the engine after it can no longer
have tokens of the new weights labelled with the old version: proven here with two interceptors
(each applied it when the announce returned), a crashed one named in the failure, and 20 streams
across a keep-pause update under CPU load, checked token by token against the engine's own record
of which version sampled each token (hidden from the interceptor, which labels by arrival).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

import httpx
import pytest

from compose.engines.vllm_rig.admin import set_version
from compose.rig.stack import LocalStack
from schemas.kafka.announce import NotConfirmed, VersionAnnouncer, announce_version
from tests.integration.keep_pause import cpu_burner, keep_pause_runs, label_sync

pytestmark = [pytest.mark.integration, pytest.mark.real_broker]


def _stack(kafka_bootstrap, tmp_path_factory, *policy_args: str) -> LocalStack:
    return LocalStack(kafka_bootstrap, tmp_path_factory.mktemp("av"), topic_prefix=f"av{uuid.uuid4().hex[:8]}.",
                      with_pipeline=False, policy_args=policy_args)


def _health(url: str) -> dict:
    return httpx.get(f"{url}/healthz", timeout=10).json()


def test_announce_returns_once_both_interceptors_applied_and_names_a_dead_one(kafka_bootstrap, tmp_path_factory):
    with _stack(kafka_bootstrap, tmp_path_factory) as stack:
        b = stack.add_interceptor("b")
        urls = {"a": stack.interceptor_url, "b": str(b.url)}
        ids = {name: _health(url)["version_instance"] for name, url in urls.items()}
        assert all(ids.values()) and len(set(ids.values())) == 2, ids
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "compose.cli", "versions", "announce", "v1", "--step", "1",
                               "--bootstrap", kafka_bootstrap, "--topic-prefix", stack.topic_prefix],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert sorted(json.loads(done.stdout)["confirmed_by"]) == sorted(ids.values())
        # Read right after it returned, with no wait: each has applied it already.
        assert {n: _health(u)["policy_version"] for n, u in urls.items()} == {"a": "v1", "b": "v1"}
        assert all(_health(u)["policy_version_fresh"] for u in urls.values())

        stack.kill("b")  # a crash: no tombstone, its last report still says it is live
        with pytest.raises(NotConfirmed) as exc:
            announce_version(kafka_bootstrap, "v2", 2, topic=stack.topics.policy_versions, confirm_timeout_s=3)
        message = str(exc.value)
        assert exc.value.missing == [ids["b"]], message
        assert ids["b"] in message and ids["a"] not in message and "step 2" in message
        assert "applied step 1 ('v1')" in message and "do not resume the engine" in message
        assert _health(urls["a"])["policy_version"] == "v2"
        print(f"\ntwo interceptors: confirmed, crash named, in {time.monotonic() - started:.1f} s")


def test_one_announcer_confirms_step_after_step_and_expects_an_interceptor_started_between(
        kafka_bootstrap, tmp_path_factory):
    """A trainer's standing announcer keeps the reports it read between announcements: still exact about who is live."""
    with _stack(kafka_bootstrap, tmp_path_factory) as stack, \
            VersionAnnouncer(kafka_bootstrap, topic=stack.topics.policy_versions) as announcer:
        a = _health(stack.interceptor_url)["version_instance"]
        took = []
        for step in (1, 2, 3):
            started = time.monotonic()
            announcer.announce(f"v{step}", step, confirm=False)
            assert announcer.wait_applied(f"v{step}", step, timeout_s=30) == [a]
            took.append(time.monotonic() - started)
            assert _health(stack.interceptor_url)["policy_version"] == f"v{step}"
        b = stack.add_interceptor("b")
        ids = sorted([a, _health(str(b.url))["version_instance"]])
        assert announcer.wait_applied("v3", 3, timeout_s=30) == ids  # b started after the last wait: expected now
        announcer.announce("v4", 4)
        assert {_health(u)["policy_version"] for u in (stack.interceptor_url, str(b.url))} == {"v4"}
        stack.kill("b")  # a crash: its last report still says it is live, so it is named, not waited out
        with pytest.raises(NotConfirmed) as exc:
            announcer.announce("v5", 5, confirm_timeout_s=3)
        assert exc.value.missing == [i for i in ids if i != a], str(exc.value)
    print(f"\none announcer, steps 1-3 announced and confirmed in {', '.join(f'{t * 1000:.0f}' for t in took)} ms")


async def test_no_token_sampled_after_the_resume_is_labelled_old_under_load(kafka_bootstrap, tmp_path_factory):
    """20 streams across a keep-pause update, the CPU loaded: the engine's own per-token record is the truth."""
    with _stack(kafka_bootstrap, tmp_path_factory, "--decode-ms-per-token", "4") as stack, cpu_burner():
        set_version(stack.policy_url, "v0")
        announce_version(kafka_bootstrap, "v0", 0, topic=stack.topics.policy_versions)
        started = time.monotonic()
        runs = await keep_pause_runs(stack.policy_url, kafka_bootstrap, stack.topics, 20, max_tokens=TOKENS,
                                     sync=label_sync(stack.policy_url), strip=True, counts=_crossed, budget_s=90)
    took = time.monotonic() - started
    old_labelled, both, lines = 0, 0, []
    for run in runs:
        truth = [span["version"] for span in run.truth for _ in range(span["start"], span["end"])]
        labels = [v for v, s, e in run.spans for _ in range(s, e)]
        assert len(truth) == len(labels) == TOKENS, (run.truth, run.spans)
        assert run.captured.facts.version_spans_source == "observed"  # the interceptor labelled it, not the engine
        if not _crossed(run):  # the pause landed after the stream ended (a loaded host): nothing to test
            lines.append(f"run {run.k}: ended before the pause landed, not counted")
            continue
        after_resume = [i for i, v in enumerate(truth) if v == f"v{run.k}"]
        both += {f"v{run.k - 1}", f"v{run.k}"} <= set(labels)
        wrong = [i for i in after_resume if labels[i] == f"v{run.k - 1}"]
        old_labelled += len(wrong)
        lines.append(f"run {run.k}: spans {run.spans}, first new token {after_resume[0]}, announce "
                     f"{run.announce_s * 1000:.0f} ms, old-labelled {len(wrong)}")
    print(f"\n20 runs in {took:.1f} s; tokens sampled after the resume labelled old: {old_labelled}; runs with both "
          f"versions: {both}\n" + "\n".join(lines))
    assert old_labelled == 0, "\n".join(lines)
    assert sum(map(_crossed, runs)) >= 20, "fewer than 20 runs generated across the update:\n" + "\n".join(lines)


TOKENS = 160  # 0.64 s of decode at 4 ms a token: the pause asked for at the first token lands mid-stream


def _crossed(run) -> bool:
    """The engine sampled tokens of the new version after some of the old one: the run spans the update."""
    return any(span["version"] == f"v{run.k}" and span["start"] > 0 for span in run.truth)
