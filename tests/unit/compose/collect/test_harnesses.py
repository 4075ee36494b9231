"""How each harness's ending becomes an outcome: the CLI's exit, its events and its deadline (CLI stubbed)."""

from __future__ import annotations

from pathlib import Path

import pytest

import compose.harnesses.claude_code as cc
import compose.harnesses.codex.runner as cx
import compose.harnesses.gemini_cli as gm
from compose.collect.harnesses import Attempt, ClaudeCodeHarness, CodexHarness, GeminiCliHarness, OpenAISdkHarness
from compose.collect.outcome import FailureClass
from compose.collect.settings import CollectSettings
from compose.harnesses.claude_code.runner import ClaudeCodeResult
from compose.harnesses.codex.runner import CodexResult
from compose.harnesses.gemini_cli.runner import GeminiCliResult
from compose.harnesses.sdk import Outcome

SETTINGS = CollectSettings(tasks=Path("t"), out=Path("o.jsonl"), harness="claude-code", local=True,
                           call_timeout_s=12.5, max_turns=7)


class _Task:
    id, prompt, tools, files = "t", "what is 2+2?", (), {}


def _attempt(tmp_path) -> Attempt:
    return Attempt(_Task(), "run.t-0", 0, tmp_path, "http://i/ng-rollout/run.t-0/training-token-capture", "tok")


def _cc(returncode, *, timed_out=False, result=None, events=()):
    return ClaudeCodeResult(returncode, timed_out, result, list(events), "out", "err")


@pytest.mark.parametrize("done,cls", [
    (_cc(None, timed_out=True), FailureClass.TIMEOUT),
    (_cc(-9), FailureClass.HARNESS_CRASH),
    (_cc(137), FailureClass.HARNESS_CRASH),
    (_cc(1, result={"type": "result", "subtype": "error_max_turns", "is_error": True}), FailureClass.MAX_STEPS),
    (_cc(1, result={"type": "result", "subtype": "error_during_execution", "is_error": True}),
     FailureClass.NONZERO_EXIT),
    (_cc(0), FailureClass.INVALID_OUTPUT),
    (_cc(0, result={"type": "result", "is_error": True, "result": "API Error"}), FailureClass.INVALID_OUTPUT),
])
async def test_claude_code_endings(monkeypatch, tmp_path, done, cls):
    monkeypatch.setattr(cc, "run_claude_code", lambda *a, **k: done)
    outcome = await ClaudeCodeHarness(SETTINGS).run(_attempt(tmp_path))
    assert outcome.failure is not None and outcome.failure.failure_class == cls


async def test_claude_code_answer_and_what_it_is_given(monkeypatch, tmp_path):
    seen = {}

    def fake(base_url, prompt, **kw):
        seen.update(kw, base_url=base_url, prompt=prompt)
        return _cc(0, result={"type": "result", "result": "<answer>4</answer>", "num_turns": 3},
                   events=[{"type": "assistant", "message": {"id": "msg_tt1"}},
                           {"type": "assistant", "message": {"id": "msg_tt2"}}])

    monkeypatch.setattr(cc, "run_claude_code", fake)
    outcome = await ClaudeCodeHarness(SETTINGS).run(_attempt(tmp_path))
    assert (outcome.final_text, outcome.final_response_id, outcome.steps) == ("<answer>4</answer>", "msg_tt2", 3)
    assert seen["base_url"].endswith("/training-token-capture") and seen["prompt"] == "what is 2+2?"
    assert seen["env"] == {"ANTHROPIC_API_KEY": "tok", "API_TIMEOUT_MS": "12500"}
    assert seen["extra_args"] == ["--max-turns", "7"] and seen["allowed_tools"] == ["Bash"]
    assert seen["workdir"] == tmp_path and callable(seen["on_spawn"])


async def test_codex_endings_and_config(monkeypatch, tmp_path):
    seen = {}
    ok = CodexResult(0, False, [{"type": "item.completed", "item": {"type": "agent_message", "text": "done"}},
                                {"type": "turn.completed"}], "", "")
    failed_turn = CodexResult(0, False, [{"type": "turn.failed", "error": {"message": "stream error"}}], "", "")

    def fake(base_url, prompt, **kw):
        seen.update(kw, base_url=base_url)
        return seen.pop("next")

    monkeypatch.setattr(cx, "run_codex", fake)
    harness = CodexHarness(SETTINGS.model_copy(update={"harness": "codex"}))
    seen["next"] = ok
    assert (await harness.run(_attempt(tmp_path))).final_text == "done"
    assert seen["base_url"].endswith("/training-token-capture/v1")
    assert seen["config"] == {"model_providers": {"tokentrail": {"stream_idle_timeout_ms": 12500}}}
    seen["next"] = failed_turn
    outcome = await harness.run(_attempt(tmp_path))
    assert outcome.failure.failure_class == FailureClass.INVALID_OUTPUT and "stream error" in outcome.failure.detail


def _gm(returncode, events=(), *, timed_out=False):
    return GeminiCliResult(returncode, timed_out, list(events), "out", "err")


_GM_TOOL = [{"type": "tool_use", "tool_name": "run_shell_command", "tool_id": "t1", "parameters": {}},
            {"type": "tool_result", "tool_id": "t1", "status": "success", "output": "x"}]
_GM_LIMIT = {"type": "result", "status": "error", "error": {"type": "FatalTurnLimitedError",
                                                             "message": "Reached max session turns"}}


@pytest.mark.parametrize("done,cls,detail", [
    (_gm(None, timed_out=True), FailureClass.TIMEOUT, "deadline"),
    (_gm(137), FailureClass.HARNESS_CRASH, "died"),
    (_gm(53, [*_GM_TOOL, _GM_LIMIT]), FailureClass.MAX_STEPS, "within 7 model calls"),
    (_gm(1, [{"type": "error", "severity": "error", "message": "upstream 503"},
             {"type": "result", "status": "error", "error": {"message": "API Error"}}]),
     FailureClass.NONZERO_EXIT, "upstream 503; API Error"),
    (_gm(0, [*_GM_TOOL, {"type": "result", "status": "success"}]), FailureClass.INVALID_OUTPUT, "no successful"),
])
async def test_gemini_cli_endings(monkeypatch, tmp_path, done, cls, detail):
    monkeypatch.setattr(gm, "run_gemini_cli", lambda *a, **k: done)
    outcome = await GeminiCliHarness(SETTINGS.model_copy(update={"harness": "gemini-cli"})).run(_attempt(tmp_path))
    assert outcome.failure is not None and outcome.failure.failure_class == cls and detail in outcome.failure.detail


async def test_gemini_cli_answer_and_what_it_is_given(monkeypatch, tmp_path):
    seen = {}

    def fake(base_url, prompt, **kw):
        seen.update(kw, base_url=base_url, prompt=prompt)
        return _gm(0, [*_GM_TOOL, {"type": "message", "role": "assistant", "content": "<answer>4", "delta": True},
                       {"type": "message", "role": "assistant", "content": "</answer>", "delta": True},
                       {"type": "result", "status": "success"}])

    monkeypatch.setattr(gm, "run_gemini_cli", fake)
    outcome = await GeminiCliHarness(SETTINGS.model_copy(update={"harness": "gemini-cli"})).run(_attempt(tmp_path))
    assert (outcome.failure, outcome.final_text, outcome.final_response_id, outcome.steps) == (
        None, "<answer>4</answer>", None, 2)
    # The capture root itself (the CLI appends /v1beta/models/...), the rollout token, the turn budget.
    assert seen["base_url"] == "http://i/ng-rollout/run.t-0/training-token-capture" and seen["prompt"] == "what is 2+2?"
    assert seen["api_key"] == "tok" and seen["settings"] == {"model": {"maxSessionTurns": 7}}
    assert seen["model"] == "tokentrail-policy" and seen["workdir"] == tmp_path and callable(seen["on_spawn"])


async def test_a_cli_that_cannot_start_is_a_crash_not_an_exception(monkeypatch, tmp_path):
    def boom(*a, **k):
        raise FileNotFoundError("no such file: claude")

    monkeypatch.setattr(cc, "run_claude_code", boom)
    outcome = await ClaudeCodeHarness(SETTINGS).run(_attempt(tmp_path))
    assert outcome.failure.failure_class == FailureClass.HARNESS_CRASH and "claude" in outcome.failure.detail


@pytest.mark.parametrize("o,cls", [
    (Outcome("r", error="APITimeoutError: timed out", timed_out=True), FailureClass.TIMEOUT),
    (Outcome("r", error="no final answer after 3 turns", turns_exhausted=True), FailureClass.MAX_STEPS),
    (Outcome("r", error="APIStatusError: 503"), FailureClass.TRANSPORT),
    (Outcome("r", final_text="<answer>1</answer>", final_response_id="chatcmpl-tt0", calls=2), None),
])
def test_sdk_loop_endings(o, cls):
    outcome = OpenAISdkHarness._outcome(o)
    assert (outcome.failure.failure_class if outcome.failure else None) == cls
