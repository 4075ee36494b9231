"""The harnesses ``tokentrail collect`` drives, behind one ``Harness`` protocol.

Each harness gets one attempt at a time: the task, the attempt's rollout id, a fresh
working directory and the capture base URL of the attempt with its API key (the rollout
token when the interceptor requires one). It hands back text only (``HarnessOutcome``):
the token ids are captured in the serving path, never read from the harness.

* ``claude-code``: the real CLI, headless (``compose.harnesses.claude_code``): ``ANTHROPIC_BASE_URL``,
  every model variable set to the run's model, ``--allowedTools``, ``--max-turns``,
  ``API_TIMEOUT_MS`` for a call's deadline.
* ``codex``: the real CLI (``compose.harnesses.codex``): a Responses provider in ``config.toml``
  (``wire_api = "responses"``) at the capture URL, ``stream_idle_timeout_ms`` for a call.
* ``gemini-cli``: the real CLI (``compose.harnesses.gemini_cli``, Node.js): ``GOOGLE_GEMINI_BASE_URL`` at the
  capture root, the API key as a Bearer token, ``model.maxSessionTurns`` for the turn budget.
* ``openai-sdk`` / ``anthropic-sdk``: the SDK loops of ``compose.harnesses.sdk`` with the task's
  tool set (``compose.collect.tools``).
* ``remote``: an agent service speaking the Responses contract (``compose.collect.remote_agent``).

Guarantees: ``check()`` fails at start-up (ConfigError) when the harness cannot run here;
``run`` never raises for what a harness does (every failure is a classed ``HarnessOutcome``);
``stop_all`` ends every CLI run in flight at once (Ctrl-C), and a CLI run never outlives the
collector (``compose.procs.headless``).
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from compose.collect.outcome import FailureClass, HarnessOutcome
from compose.collect.tools import ToolSet
from compose.procs.headless import stop_group, tail
from schemas.errors import ConfigError, TokentrailError

if TYPE_CHECKING:
    from collections.abc import Callable

    from compose.collect.settings import CollectSettings
    from compose.collect.tasks import Task

__all__ = ["Attempt", "Harness", "make_harness"]

DEFAULT_SYSTEM = ("You are a careful assistant. Use the tools when they help. "
                  "Give your final answer as <answer>...</answer>.")


@dataclass(frozen=True)
class Attempt:
    task: Task
    rollout_id: str
    attempt: int
    workdir: Path
    capture_root: str  # http://host:port/ng-rollout/<rollout id>/training-token-capture
    api_key: str       # what the harness sends as its API key (the rollout token, or a dummy)

    @property
    def openai_base_url(self) -> str:
        return self.capture_root + "/v1"


class Harness(Protocol):
    """One kind of harness. ``run`` never raises; it returns within the settings' rollout deadline
    (plus a kill grace) with the final text or a classed failure, and leaves no process behind."""

    name: str

    def check(self) -> None: ...

    async def run(self, attempt: Attempt) -> HarnessOutcome: ...

    def stop_all(self) -> None: ...


class _CliHarness:
    """What the two CLI harnesses share: a thread per run, and a registry of runs in flight."""

    name = "cli"

    def __init__(self, settings: CollectSettings) -> None:
        self.settings = settings
        self.binary: Path | None = None
        self._live: set[int] = set()
        self._lock = threading.Lock()

    def check(self) -> None:
        """The pinned CLI, installed if needed (npm), once, before any rollout runs."""
        try:
            self.binary = self._install()
        except TokentrailError as exc:
            raise ConfigError(f"--harness {self.name} cannot run here: {exc}") from exc

    def _install(self) -> Path:
        raise NotImplementedError

    def _spawned(self, pgid: int) -> None:
        with self._lock:
            self._live.add(pgid)

    def stop_all(self) -> None:
        with self._lock:
            live = list(self._live)
        for pgid in live:
            stop_group(pgid)

    async def run(self, attempt: Attempt) -> HarnessOutcome:
        try:
            return await asyncio.to_thread(self._run, attempt)
        except TokentrailError as exc:  # the CLI could not be started
            return HarnessOutcome.failed(FailureClass.HARNESS_CRASH, f"{type(exc).__name__}: {exc}")
        except OSError as exc:
            return HarnessOutcome.failed(FailureClass.HARNESS_CRASH, f"could not start the CLI: {exc}")

    def _run(self, attempt: Attempt) -> HarnessOutcome:
        raise NotImplementedError


def _exit_failure(returncode: int | None, timed_out: bool, timeout: float, stderr: str) -> HarnessOutcome | None:
    if timed_out:
        return HarnessOutcome.failed(FailureClass.TIMEOUT, f"killed at the rollout deadline ({timeout:.0f} s)")
    if returncode is None or returncode < 0 or returncode >= 128:
        return HarnessOutcome.failed(FailureClass.HARNESS_CRASH, f"the CLI died (status {returncode}): {tail(stderr, 600)}")
    return None


class ClaudeCodeHarness(_CliHarness):
    name = "claude-code"

    def _install(self) -> Path:
        from compose.harnesses.claude_code import ensure_claude_code

        return ensure_claude_code()

    def _run(self, attempt: Attempt) -> HarnessOutcome:
        from compose.harnesses.claude_code import run_claude_code

        s = self.settings
        result = run_claude_code(
            attempt.capture_root, attempt.task.prompt, workdir=attempt.workdir, timeout=s.rollout_timeout_s,
            model=s.harness_model, allowed_tools=list(s.allowed_tools), executable=self.binary,
            extra_args=["--max-turns", str(s.max_turns)], on_spawn=self._spawned,
            env={"ANTHROPIC_API_KEY": attempt.api_key, "API_TIMEOUT_MS": str(int(s.call_timeout_s * 1000))})
        failed = _exit_failure(result.returncode, result.timed_out, s.rollout_timeout_s, result.stderr_tail)
        if failed is not None:
            return failed
        turns = result.num_turns or 0
        if result.result is not None and result.result.get("subtype") == "error_max_turns":
            return HarnessOutcome.failed(FailureClass.MAX_STEPS, f"no final answer within --max-turns {s.max_turns}",
                                         steps=turns)
        if result.returncode != 0:
            return HarnessOutcome.failed(FailureClass.NONZERO_EXIT, f"claude exited {result.returncode}: "
                                         f"{tail(result.stderr_tail or result.stdout_tail, 600)}", steps=turns)
        if not result.ok:
            return HarnessOutcome.failed(FailureClass.INVALID_OUTPUT, "no successful result event in the CLI's "
                                         f"stream-json output: {tail(result.stdout_tail, 600)}", steps=turns)
        ids = [e["message"]["id"] for e in result.events
               if e.get("type") == "assistant" and (e.get("message") or {}).get("id")]
        return HarnessOutcome(final_text=result.final_text or "", final_response_id=ids[-1] if ids else None,
                              steps=turns)


class CodexHarness(_CliHarness):
    name = "codex"

    def _install(self) -> Path:
        from compose.harnesses.codex import ensure_codex

        return ensure_codex()

    def _run(self, attempt: Attempt) -> HarnessOutcome:
        from compose.harnesses.codex.runner import API_KEY_ENV, PROVIDER_ID, run_codex

        s = self.settings
        result = run_codex(
            attempt.openai_base_url, attempt.task.prompt, workdir=attempt.workdir, timeout=s.rollout_timeout_s,
            model=s.harness_model or "tokentrail-policy", executable=self.binary, on_spawn=self._spawned,
            env={API_KEY_ENV: attempt.api_key},
            config={"model_providers": {PROVIDER_ID: {"stream_idle_timeout_ms": int(s.call_timeout_s * 1000)}}})
        failed = _exit_failure(result.returncode, result.timed_out, s.rollout_timeout_s, result.stderr_tail)
        if failed is not None:
            return failed
        turns = len(result.items("agent_message")) + len(result.tool_calls())
        if result.returncode != 0:
            return HarnessOutcome.failed(FailureClass.NONZERO_EXIT, f"codex exited {result.returncode}: "
                                         f"{tail(result.stderr_tail, 600)}", steps=turns)
        if not result.ok or result.final_text is None:
            return HarnessOutcome.failed(FailureClass.INVALID_OUTPUT, "the turn did not complete with an agent "
                                         f"message: {'; '.join(result.errors())[:600]}", steps=turns)
        # `codex exec --json` reports no response ids: terminal attribution goes by the final text.
        return HarnessOutcome(final_text=result.final_text, steps=turns)


class GeminiCliHarness(_CliHarness):
    name = "gemini-cli"

    def _install(self) -> Path:
        from compose.harnesses.gemini_cli import ensure_gemini_cli, node_executable

        entry = ensure_gemini_cli()
        node_executable()  # the bundle needs Node.js >= 20: refused at start-up, not at the first rollout
        return entry

    def _run(self, attempt: Attempt) -> HarnessOutcome:
        from compose.harnesses.gemini_cli import run_gemini_cli

        s = self.settings
        result = run_gemini_cli(
            attempt.capture_root, attempt.task.prompt, workdir=attempt.workdir, timeout=s.rollout_timeout_s,
            model=s.harness_model or "tokentrail-policy", api_key=attempt.api_key, entry=self.binary,
            on_spawn=self._spawned, settings={"model": {"maxSessionTurns": s.max_turns}})
        failed = _exit_failure(result.returncode, result.timed_out, s.rollout_timeout_s, result.stderr_tail)
        if failed is not None:
            return failed
        steps = len(result.tool_uses()) + (result.final_text is not None)
        final_error = ((result.result or {}).get("error") or {}).get("message")
        errors = "; ".join([*(str(e.get("message")) for e in result.errors()), *([final_error] if final_error else [])])
        if result.returncode == 53:  # FatalTurnLimitedError: maxSessionTurns model calls, no answer
            return HarnessOutcome.failed(FailureClass.MAX_STEPS, f"no final answer within {s.max_turns} model calls",
                                         steps=steps)
        if result.returncode != 0:
            return HarnessOutcome.failed(FailureClass.NONZERO_EXIT, f"gemini exited {result.returncode}: "
                                         f"{tail(errors or result.stderr_tail, 600)}", steps=steps)
        if not result.ok or result.final_text is None:
            return HarnessOutcome.failed(FailureClass.INVALID_OUTPUT, "no successful result event with an answer in "
                                         f"the CLI's stream-json output: {tail(result.stdout_tail, 600)}", steps=steps)
        # stream-json reports no response ids: terminal attribution goes by the final text.
        return HarnessOutcome(final_text=result.final_text, steps=steps)


class _SdkHarness:
    def __init__(self, settings: CollectSettings) -> None:
        self.settings = settings

    def check(self) -> None:
        pass

    def stop_all(self) -> None:
        pass  # in-process: cancelling the task ends the call

    @staticmethod
    def _impl(tools: ToolSet):
        return lambda name, arguments, n: tools.call(name, arguments)

    @staticmethod
    def _outcome(o) -> HarnessOutcome:
        if o.error is None:
            return HarnessOutcome(final_text=o.final_text or "", final_response_id=o.final_response_id,
                                  steps=o.calls)
        if o.turns_exhausted:
            return HarnessOutcome.failed(FailureClass.MAX_STEPS, o.error, steps=o.calls)
        cls = FailureClass.TIMEOUT if o.timed_out else FailureClass.TRANSPORT
        return HarnessOutcome.failed(cls, o.error, steps=o.calls)


class OpenAISdkHarness(_SdkHarness):
    name = "openai-sdk"

    async def run(self, attempt: Attempt) -> HarnessOutcome:
        from compose.harnesses.sdk import run_rollout

        s, tools = self.settings, ToolSet.for_task(attempt.task, attempt.workdir)
        model = s.harness_model
        assert model is not None  # DEFAULT_MODELS names one for this harness
        o = await run_rollout(attempt.openai_base_url, attempt.rollout_id, attempt.task.prompt,
                              tools=tools.chat_tools(), tool_impl=self._impl(tools), model=model,
                              max_turns=s.max_steps, system=s.system_prompt or DEFAULT_SYSTEM,
                              api_key=attempt.api_key, timeout=s.call_timeout_s)
        return self._outcome(o)


class AnthropicSdkHarness(_SdkHarness):
    name = "anthropic-sdk"

    async def run(self, attempt: Attempt) -> HarnessOutcome:
        from compose.harnesses.sdk import run_anthropic_rollout

        s, tools = self.settings, ToolSet.for_task(attempt.task, attempt.workdir)
        model = s.harness_model
        assert model is not None  # DEFAULT_MODELS names one for this harness
        o = await run_anthropic_rollout(attempt.capture_root, attempt.rollout_id, attempt.task.prompt,
                                        tools=tools.anthropic_tools(), tool_impl=self._impl(tools),
                                        model=model, max_turns=s.max_steps,
                                        system=s.system_prompt or DEFAULT_SYSTEM, api_key=attempt.api_key,
                                        timeout=s.call_timeout_s)
        return self._outcome(o)


class RemoteHarness(_SdkHarness):
    name = "remote"

    def check(self) -> None:
        from compose.collect.remote_agent import RemoteAgent

        s = self.settings
        self.agent = RemoteAgent(url=str(s.agent_url), max_steps=s.max_steps, request_timeout_s=s.call_timeout_s,
                                 model=s.harness_model or "tokentrail-policy")

    async def run(self, attempt: Attempt) -> HarnessOutcome:
        from compose.collect.remote_agent import drive

        return await drive(self.agent, task=attempt.task, rollout_id=attempt.rollout_id,
                           tools=ToolSet.for_task(attempt.task, attempt.workdir),
                           model_base_url=attempt.openai_base_url, model_api_key=attempt.api_key)


_HARNESSES: dict[str, Callable[[CollectSettings], Harness]] = {
    "claude-code": ClaudeCodeHarness, "codex": CodexHarness, "gemini-cli": GeminiCliHarness,
    "openai-sdk": OpenAISdkHarness,
    "anthropic-sdk": AnthropicSdkHarness, "remote": RemoteHarness}


def make_harness(settings: CollectSettings) -> Harness:
    """The harness the settings name, checked (ConfigError when it cannot run here)."""
    harness = _HARNESSES[settings.harness](settings)
    harness.check()
    return harness
