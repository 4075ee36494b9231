"""The real OpenAI Codex CLI (npm @openai/codex), non-interactive and offline, against the
interceptor in front of either engine: a multi-turn session that runs shell
commands through Codex's own ``exec_command`` tool is captured over the Responses API, rebuilt
as one unmasked chain, and is token-exact under re-scoring."""

from __future__ import annotations

import uuid

import pytest

from compose.rig.stack import LocalStack
from tests.integration.engines import assert_one_token_exact_chain

pytestmark = [pytest.mark.integration, pytest.mark.real_broker]


@pytest.fixture(scope="module")
def codex_stack(kafka_bootstrap, tmp_path_factory, upstream):
    tag = uuid.uuid4().hex[:8]
    # Codex's instructions, skills list and tool schemas are ~40 KB of text per request: the
    # reference server's word-level tokenizer needs a long context; vLLM keeps its 32768.
    policy_args = ("--max-model-len", "262144") if upstream is None else ()
    # With a rollout secret: Codex carries its rollout token as its provider's API key (env_key), unmodified.
    with LocalStack(kafka_bootstrap, tmp_path_factory.mktemp("codex"), topic_prefix=f"cx{tag}.",
                    processor_id=f"cx{tag}", policy_args=policy_args, upstream_url=upstream,
                    rollout_secret="e2e-rollout-secret-0123456789abcdef") as running:
        yield running


def test_codex_session_is_captured_token_exact(codex, codex_stack, tmp_path):
    from compose.harnesses.codex import DEFAULT_MODEL, run_codex
    from compose.harnesses.codex.runner import API_KEY_ENV

    rid = f"codex-{uuid.uuid4().hex[:8]}"
    result = run_codex(
        codex_stack.capture_base_url(rid),
        "Check the working directory with one shell command, then summarise. #tool-calls=2",
        workdir=tmp_path, timeout=180, model=DEFAULT_MODEL, executable=codex,
        env={API_KEY_ENV: codex_stack.api_key(rid)},
    )
    assert result.ok, f"codex exited {result.returncode}: {result.errors()}\n{result.stderr_tail}\n{result.stdout_tail}"
    # The stand-in called Codex's default shell tool twice, and Codex ran both commands to their
    # end (exit code reported; the stand-in's arguments decide what the commands were).
    calls = result.tool_calls()
    assert len(calls) >= 2, result.stdout_tail
    assert all(c["exit_code"] is not None and c["status"] in ("completed", "failed") for c in calls), calls
    for call in calls:
        if "echo tokentrail" in call["command"]:
            assert "tokentrail" in call["aggregated_output"], call
    assert result.final_text

    codex_stack.finish(rid, {"reward": 1.0}, final_text=result.final_text)
    record = codex_stack.wait_rollouts([rid], timeout=90)[rid]
    assert_one_token_exact_chain(codex_stack, record)
