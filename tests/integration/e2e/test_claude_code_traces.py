"""The real Claude Code CLI, headless and offline, delivered with ``delivery_mode="traces"``:
a sub-agent and a manual compaction are each captured as labelled, token-exact traces.

What is checked, for every rollout:
- the record is unmasked, and every trace's tokens (its prefix trace's first ``prefix_len``
  tokens, then its own) re-score on the engine to its log-probs, bit for bit, at every
  loss-bearing position;
- every generated token is loss-bearing exactly once: the traces' loss tokens add up to the
  generated tokens captured, and no call belongs to two traces.

The sub-agent run is the main loop calling ``Agent`` once (foreground: with background tasks
on, the notification turn resets the reference policy's tool count and the main loop
re-delegates forever). The compaction is the manual route: a persisted run, ``/compact``
resumed on that session (its ``#tool-calls=0 #answer-words=40`` becomes the summary prompt's
additional instructions, so the reference policy answers in text, long enough to hold a whole
``compaction_min_tokens`` window once the CLI drops the summary's thinking), then a resumed run with a new prompt.
The first prompt after ``/compact`` carries the summary's text (its thinking dropped) and, verbatim,
the last turn the CLI keeps: the rebuild links the segment to the later of the two, the summary.

Not tested:
- auto-compaction: with the CLI's ~20K-token system prompt and tools, a window small enough
  to trigger it is exceeded again on every turn, and the CLI stops with "Autocompact is
  thrashing" (exit 1);
- real vLLM: its crafted checkpoint only ever calls Claude Code's ``Bash`` (then answers), so it
  can neither delegate to a sub-agent nor answer a summary request with text.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from compose.rig.stack import LocalStack
from tests.integration import engines
from tests.integration.engines import assert_traces_exact

pytestmark = [pytest.mark.integration, pytest.mark.real_broker]
ROLLOUT_SECRET = "e2e-rollout-secret-0123456789abcdef"
TIMEOUT_S = 120


@pytest.fixture(scope="module")
def traces_stack(kafka_bootstrap, tmp_path_factory):
    with engines.traces_stack(kafka_bootstrap, tmp_path_factory.mktemp("cctr"), "cctr", ROLLOUT_SECRET) as running:
        yield running


def _run(stack: LocalStack, rid: str, prompt: str, workdir: Path, **kwargs: Any):
    from compose.harnesses.claude_code import run_claude_code

    result = run_claude_code(stack.capture_base_url(rid).removesuffix("/v1"), prompt, workdir=workdir,
                             timeout=TIMEOUT_S, env={"ANTHROPIC_API_KEY": stack.api_key(rid), **kwargs.pop("env", {})},
                             **kwargs)
    assert result.ok, f"claude exited {result.returncode}: {result.stderr_tail}\n{result.stdout_tail}"
    return result


def _main_message_ids(result) -> list[str]:
    """The main loop's assistant message ids, in order (sub-agent events carry ``parent_tool_use_id``)."""
    ids = []
    for e in result.events:
        if e.get("type") == "assistant" and e.get("parent_tool_use_id") is None:
            mid = (e.get("message") or {}).get("id")
            if mid and (not ids or ids[-1] != mid):
                ids.append(mid)
    return ids


def _tool_uses(result, name: str) -> list[dict]:
    return [b for e in result.events if e.get("type") == "assistant"
            for b in (e.get("message") or {}).get("content") or [] if b.get("type") == "tool_use" and b["name"] == name]


def _finish_and_wait(stack: LocalStack, rid: str, last) -> dict:
    stack.finish(rid, {"reward": 1.0}, final_response_id=_main_message_ids(last)[-1], final_text=last.final_text)
    return stack.wait_rollouts([rid], timeout=90)[rid]


def call_outputs(traces: list[dict]) -> dict[str, dict]:
    """Each call's answer text and tool calls, from its trace's response projection.

    A trace's response holds its own calls only, one ``message`` item per call, in
    ``call_ids`` order; a ``function_call`` item belongs to the message before it.
    """
    out: dict[str, dict] = {}
    for trace in traces:
        messages: list[dict] = []
        for item in trace["response"]["output"]:
            if item["type"] == "message":
                text = "".join(c.get("text", "") for c in item["content"] if c.get("type") == "output_text")
                messages.append({"text": text, "tool_calls": []})
            elif item["type"] == "function_call":
                messages[-1]["tool_calls"].append((item["name"], item["call_id"]))
        assert len(messages) == len(trace["call_ids"]), (trace["kind"], trace["call_ids"])
        out.update(zip(trace["call_ids"], messages))
    return out


def _compact_summary(home: Path, session_id: str) -> str:
    """The summary message Claude Code saved in the session transcript at ``/compact``."""
    (transcript,) = (home / ".claude" / "projects").glob(f"*/{session_id}.jsonl")
    found = [e["message"]["content"] for e in map(json.loads, transcript.read_text().splitlines())
             if e.get("isCompactSummary")]
    assert len(found) == 1 and isinstance(found[0], str), found
    return found[0]


def _describe(traces: list[dict]) -> str:
    return json.dumps([{k: t[k] for k in ("kind", "label", "segment", "parent_trace", "attachment", "classified_by",
                                          "prefix_trace", "prefix_len", "call_ids", "mask_reasons")}
                       for t in traces], indent=1)


def _one(traces: list[dict], kind: str) -> int:
    found = [i for i, t in enumerate(traces) if t["kind"] == kind]
    assert len(found) == 1, f"expected one {kind} trace:\n{_describe(traces)}"
    return found[0]


def test_subagent_is_its_own_trace_attached_to_the_agent_call(claude, traces_stack, tmp_path):
    rid = f"cc-sub-{uuid.uuid4().hex[:8]}"
    result = _run(traces_stack, rid, "Delegate this to a sub-agent. #tool=Agent #tool-calls=1", tmp_path,
                  env={"CLAUDE_CODE_DISABLE_BACKGROUND_TASKS": "1"})
    (agent_use,) = _tool_uses(result, "Agent")
    # The sub-agent ran in the foreground and did its own tool calls under the Agent call.
    assert any(e.get("parent_tool_use_id") == agent_use["id"] for e in result.events if e.get("type") == "assistant")
    record = _finish_and_wait(traces_stack, rid, result)
    traces = assert_traces_exact(traces_stack, record)

    assert sorted(t["kind"] for t in traces) == ["main", "subagent"], _describe(traces)
    main, sub = _one(traces, "main"), _one(traces, "subagent")
    expected_label = agent_use["input"].get("subagent_type") or agent_use["input"]["description"]
    assert (traces[sub]["label"], traces[sub]["classified_by"]) == (expected_label, "agent_tool")
    assert traces[sub]["parent_trace"] == main
    assert traces[sub]["attachment"]["tool_call_id"] == agent_use["id"]
    # Attached to the main call that made that Agent call.
    agent_calls = [cid for cid, out in call_outputs(traces).items() if ("Agent", agent_use["id"]) in out["tool_calls"]]
    assert agent_calls == [traces[sub]["attachment"]["call_id"]] and agent_calls[0] in traces[main]["call_ids"]
    # Main: the Agent call and the answer after the hand-back; the sub-agent: two Bash calls and its report.
    assert (len(traces[main]["call_ids"]), len(traces[sub]["call_ids"])) == (2, 3)


def test_manual_compaction_continues_main_as_segment_one(claude, traces_stack, tmp_path):
    rid = f"cc-compact-{uuid.uuid4().hex[:8]}"
    home, workdir = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    workdir.mkdir()
    first = _run(traces_stack, rid, "Check the working directory with one shell command, then summarise. "
                 "#tool-calls=1", workdir, home=home, persist_session=True)
    compacted = _run(traces_stack, rid, "/compact #tool-calls=0 #answer-words=40", workdir, home=home,
                     persist_session=True,
                     resume=first.session_id)
    boundary = [e for e in compacted.events if e.get("subtype") == "compact_boundary"]
    assert len(boundary) == 1 and boundary[0]["compact_metadata"]["trigger"] == "manual", compacted.events
    last = _run(traces_stack, rid, "Now say what you did. #tool-calls=1", workdir, home=home, persist_session=True,
                resume=compacted.session_id or first.session_id)
    record = _finish_and_wait(traces_stack, rid, last)
    traces = assert_traces_exact(traces_stack, record)

    main, seg = _one(traces, "main"), _one(traces, "compaction")
    assert traces[main]["segment"] == 0
    assert (traces[seg]["segment"], traces[seg]["label"], traces[seg]["classified_by"]) == (1, "main", "summary")
    assert traces[seg]["parent_trace"] == main
    # The summary call: the one whose answer Claude Code saved as the compact summary (a retry's is not used).
    summary = _compact_summary(home, compacted.session_id or first.session_id)
    summary_calls = [cid for cid, out in call_outputs(traces).items() if out["text"] and out["text"] in summary]
    assert len(summary_calls) == 1, summary
    assert traces[seg]["attachment"]["call_id"] == summary_calls[0]
    # main's trunk ends where the next segment continues from.
    assert traces[main]["call_ids"][-1] == summary_calls[0]
    # Anything else is a fork of main (the first run's answer, the summary's retry): trained, never masked.
    others = [t for i, t in enumerate(traces) if i not in (main, seg)]
    assert all(t["kind"] == "other" and t["_ng_token_capture"]["loss_tokens"] > 0 for t in others), _describe(traces)
