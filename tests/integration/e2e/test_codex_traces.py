"""The real OpenAI Codex CLI, non-interactive and offline, delivered with ``delivery_mode="traces"``:
a sub-agent started through Codex's ``multi_agent_v1`` namespace tools is captured as its own
labelled, token-exact ``subagent`` trace hanging off the main trace.

Codex offers ``spawn_agent``/``wait_agent`` inside a Responses ``namespace`` tool and runs a call
only when its ``function_call`` names the namespace (``producers.dialects.responses_output``): this
is the end-to-end proof that the model is offered the tools and that Codex accepts the answer.

The run: the main thread calls ``spawn_agent`` (``#tool=spawn_agent``), the child (Codex sends
``x-openai-subagent: collab_spawn``) runs its default two ``exec_command`` calls and answers, the
main thread waits for it with ``wait_agent``, answers, and may answer once more to the
``<subagent_notification>`` Codex injects when the child finishes.

What is checked: the record is unmasked; every trace re-scores on the engine to its log-probs,
bit for bit, at every loss-bearing position; the traces' loss tokens add up to the generated
tokens captured; the sub-agent trace is classified by its opening message (the spawn call's
``message``) or by Codex's sub-agent header, and its parent is the main trace.

Two tests:
- ``test_spawn_agent_reaches_the_model_and_the_echo_links``: the model is offered the namespaced
  ``spawn_agent`` and calls it (before namespace support it could only call ``exec_command``),
  Codex echoes the namespaced call and the next turn links to it: one main trace, token-exact.
- ``test_codex_subagent_is_its_own_trace_under_main``: the whole sub-agent run, driven by the
  reference policy's multi-agent rules (``compose/engines/policy/multi_agent.py``: the spawn carries the
  child's task, the spawn's answer is followed by ``wait_agent`` on its ``agent_id``, Codex's
  ``<subagent_notification>`` turn is answered).
"""

from __future__ import annotations

import json
import uuid

import pytest

from compose.rig.stack import LocalStack
from tests.integration import engines
from tests.integration.engines import assert_traces_exact

pytestmark = [pytest.mark.integration, pytest.mark.real_broker]
ROLLOUT_SECRET = "e2e-rollout-secret-0123456789abcdef"


@pytest.fixture(scope="module")
def traces_stack(kafka_bootstrap, tmp_path_factory):
    with engines.traces_stack(kafka_bootstrap, tmp_path_factory.mktemp("cxtr"), "cxtr", ROLLOUT_SECRET) as running:
        yield running


def function_calls(trace: dict) -> list[dict]:
    return [item for item in trace["response"]["output"] if item["type"] == "function_call"]


def _describe(traces: list[dict]) -> str:
    return json.dumps([{k: t[k] for k in ("kind", "label", "segment", "parent_trace", "attachment", "classified_by",
                                          "prefix_trace", "prefix_len", "call_ids", "mask_reasons")}
                       for t in traces], indent=1)


def _run(codex, stack: LocalStack, rid: str, prompt: str, workdir):
    from compose.harnesses.codex import DEFAULT_MODEL, run_codex
    from compose.harnesses.codex.runner import API_KEY_ENV

    result = run_codex(stack.capture_base_url(rid), prompt, workdir=workdir, timeout=180, model=DEFAULT_MODEL,
                       executable=codex, env={API_KEY_ENV: stack.api_key(rid)})
    assert result.ok, f"codex exited {result.returncode}: {result.errors()}\n{result.stderr_tail}\n{result.stdout_tail}"
    return result


def _record(stack: LocalStack, rid: str, result) -> dict:
    stack.finish(rid, {"reward": 1.0}, final_text=result.final_text)
    return stack.wait_rollouts([rid], timeout=90)[rid]


PROMPT = "Delegate to a sub-agent. #tool=spawn_agent #tool-calls=1"


def test_spawn_agent_reaches_the_model_and_the_echo_links(codex, traces_stack, tmp_path):
    rid = f"codex-ns-{uuid.uuid4().hex[:8]}"
    result = _run(codex, traces_stack, rid, PROMPT, tmp_path)
    traces = assert_traces_exact(traces_stack, _record(traces_stack, rid, result))
    main = [t["kind"] for t in traces].index("main")
    # The policy was offered spawn_agent (it is inside Codex's multi_agent_v1 namespace) and called it.
    assert [c["name"] for c in function_calls(traces[main])][:1] == ["spawn_agent"], _describe(traces)
    # Codex echoed the namespaced call with its output and the next turn extended it: the same trace.
    assert len(traces[main]["call_ids"]) >= 2, _describe(traces)


def test_codex_subagent_is_its_own_trace_under_main(codex, traces_stack, tmp_path):
    rid = f"codex-sub-{uuid.uuid4().hex[:8]}"
    result = _run(codex, traces_stack, rid, PROMPT, tmp_path)
    # Codex ran the namespaced calls: it spawned one agent and waited until that agent completed.
    collab = {e["item"]["tool"]: e["item"] for e in result.events
              if e.get("type") == "item.completed" and (e.get("item") or {}).get("type") == "collab_tool_call"}
    assert collab.keys() == {"spawn_agent", "wait"}, result.stdout_tail
    (child,) = collab["spawn_agent"]["receiver_thread_ids"]
    assert collab["wait"]["agents_states"][child]["status"] == "completed", result.stdout_tail
    traces = assert_traces_exact(traces_stack, _record(traces_stack, rid, result))

    kinds = [t["kind"] for t in traces]
    assert sorted(kinds) == ["main", "subagent"], _describe(traces)
    main, sub = kinds.index("main"), kinds.index("subagent")
    assert traces[sub]["parent_trace"] == main, _describe(traces)
    # The main thread spawned once (namespaced, so Codex ran it), then waited on that agent.
    names = [c["name"] for c in function_calls(traces[main])]
    assert names[:2] == ["spawn_agent", "wait_agent"], names
    spawn = function_calls(traces[main])[0]
    assert json.loads(spawn["arguments"])["message"] == collab["spawn_agent"]["prompt"]
    classified_by = traces[sub]["classified_by"]
    assert classified_by in ("agent_tool", "agent_header"), _describe(traces)
    if classified_by == "agent_tool":  # the child's opening user turn is the spawn's message
        assert traces[sub]["attachment"]["tool_call_id"] == spawn["call_id"], _describe(traces)
        assert traces[sub]["attachment"]["call_id"] in traces[main]["call_ids"]
    # The child: its two exec_command calls, then its answer.
    assert [c["name"] for c in function_calls(traces[sub])] == ["exec_command", "exec_command"]
    assert len(traces[sub]["call_ids"]) == 3, _describe(traces)
