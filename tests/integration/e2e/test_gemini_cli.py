"""The real Google Gemini CLI (npm @google/gemini-cli), headless and offline, against the
interceptor in front of either engine, over the Gemini API (``streamGenerateContent``, SSE): a
multi-turn tool-using session is captured, rebuilt as one unmasked chain, token-exact under
re-scoring, and, delivered as traces, one token-exact main trace holding every call.

The tool round trips differ by engine, and both are real:
- the reference policy picks the CLI's own shell tool (``run_shell_command``, its
  ``SHELL_TOOLS``) twice, and the CLI runs both commands;
- the crafted vLLM checkpoint knows only Claude Code's and Codex's tools, so it calls
  ``get_weather`` twice; the CLI has no such tool and answers each call with an error
  ``functionResponse`` (``Tool "get_weather" not found...``), which the next turn carries back.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from compose.rig.stack import LocalStack
from tests.integration import engines
from tests.integration.engines import assert_one_token_exact_chain, assert_traces_exact

pytestmark = [pytest.mark.integration, pytest.mark.real_broker]
ROLLOUT_SECRET = "e2e-rollout-secret-0123456789abcdef"
PROMPT = "Check the working directory with one shell command, then summarise. #tool-calls=2"
TIMEOUT_S = 180


@pytest.fixture(scope="module")
def gemini_stack(kafka_bootstrap, tmp_path_factory, upstream):
    tag = uuid.uuid4().hex[:8]
    # The CLI's system prompt and tool declarations are ~40 KB of text: the reference server's
    # word-level tokenizer needs a long context; vLLM keeps its 32768.
    policy_args = ("--max-model-len", "262144") if upstream is None else ()
    # With a rollout secret: the CLI carries its rollout token as GEMINI_API_KEY, sent as a Bearer token.
    with LocalStack(kafka_bootstrap, tmp_path_factory.mktemp("gem"), topic_prefix=f"gm{tag}.",
                    processor_id=f"gm{tag}", policy_args=policy_args, upstream_url=upstream,
                    rollout_secret=ROLLOUT_SECRET) as running:
        yield running


@pytest.fixture(scope="module")
def traces_stack(kafka_bootstrap, tmp_path_factory):
    with engines.traces_stack(kafka_bootstrap, tmp_path_factory.mktemp("gmtr"), "gmtr", ROLLOUT_SECRET) as running:
        yield running


def _run(entry: Path, stack: LocalStack, rid: str, workdir: Path):
    from compose.harnesses.gemini_cli import DEFAULT_MODEL, run_gemini_cli

    result = run_gemini_cli(stack.capture_base_url(rid).removesuffix("/v1"), PROMPT, workdir=workdir,
                            timeout=TIMEOUT_S, model=DEFAULT_MODEL, api_key=stack.api_key(rid), entry=entry)
    assert result.ok, (f"gemini exited {result.returncode}: {result.errors()}\n{result.stderr_tail}\n"
                       f"{result.stdout_tail}")
    assert result.final_text
    return result


def _record(stack: LocalStack, rid: str, result) -> dict:
    stack.finish(rid, {"reward": 1.0}, final_text=result.final_text)
    return stack.wait_rollouts([rid], timeout=90)[rid]


def _assert_shell_round_trips(result) -> None:
    """The reference policy's two run_shell_command calls, both run by the CLI to their output."""
    uses, results = result.tool_uses(), result.tool_results()
    assert [u["tool_name"] for u in uses] == ["run_shell_command"] * 2, result.stdout_tail
    assert [u["parameters"]["command"] for u in uses] == ["echo tokentrail-1", "echo tokentrail-2"]
    assert [(r["status"], r["output"]) for r in results] == [("success", "tokentrail-1"), ("success", "tokentrail-2")]


def test_gemini_cli_session_is_captured_token_exact(gemini_cli, gemini_stack, upstream, tmp_path):
    rid = f"gemini-{uuid.uuid4().hex[:8]}"
    result = _run(gemini_cli, gemini_stack, rid, tmp_path)
    if upstream is None:
        _assert_shell_round_trips(result)
    else:
        # The crafted checkpoint's get_weather: not a tool of the CLI's, answered with an error, and
        # the session goes on to the checkpoint's answer.
        uses, results = result.tool_uses(), result.tool_results()
        assert [u["tool_name"] for u in uses] == ["get_weather"] * 2, result.stdout_tail
        assert all(r["status"] == "error" and r["error"]["type"] == "tool_not_registered" for r in results), results
    record = _record(gemini_stack, rid, result)
    # One call per model turn: two tool calls, then the answer.
    assert_one_token_exact_chain(gemini_stack, record)
    assert record["_ng_token_capture"]["n_calls"] == 3


def test_gemini_cli_session_is_one_token_exact_main_trace(gemini_cli, traces_stack, tmp_path):
    rid = f"gemini-tr-{uuid.uuid4().hex[:8]}"
    result = _run(gemini_cli, traces_stack, rid, tmp_path)
    _assert_shell_round_trips(result)
    traces = assert_traces_exact(traces_stack, _record(traces_stack, rid, result))
    # Each turn echoes the one before it (its functionCall with the engine's id, then the
    # functionResponse): no turn starts a new trace.
    assert [t["kind"] for t in traces] == ["main"], [(t["kind"], t["classified_by"]) for t in traces]
    assert len(traces[0]["call_ids"]) == 3 and traces[0]["prefix_trace"] == -1
