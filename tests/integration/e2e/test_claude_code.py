"""The real Claude Code CLI (npm @anthropic-ai/claude-code), headless, offline, against the
interceptor in front of either engine, and inside real vLLM as its middleware: a multi-turn
tool-using session is captured, rebuilt as one unmasked chain, and is token-exact under re-scoring."""

from __future__ import annotations

import uuid

import pytest

from compose.rig.stack import LocalStack
from consumers.replay.eventlog import EventLog
from schemas.records import CallCaptured
from tests.integration.engines import assert_one_token_exact_chain
from tests.integration.warm_engines import MIDDLEWARE

pytestmark = [pytest.mark.integration, pytest.mark.real_broker]
# The interceptor requires rollout tokens (TOKENTRAIL_ROLLOUT_SECRET); each run sends its own as its API key.
ROLLOUT_SECRET = MIDDLEWARE["TOKENTRAIL_ROLLOUT_SECRET"]


@pytest.fixture(scope="module")
def cc_stack(kafka_bootstrap, tmp_path_factory, upstream):
    tag = uuid.uuid4().hex[:8]
    # Claude Code's system prompt, tools and environment message are ~50 KB of text: the reference
    # server's word-level tokenizer needs a long context; vLLM keeps its 32768 (no extra configuration).
    policy_args = ("--max-model-len", "262144") if upstream is None else ()
    # With a rollout secret: Claude Code carries its rollout token as ANTHROPIC_API_KEY, unmodified.
    # On real vLLM through the proxy, with prefix supply: each turn is generated from the exact ids sampled
    # before it (the render route splices the new turns), as a production proxy deployment runs.
    intercept_args = ("--prefix-supply",) if upstream is not None else ()
    with LocalStack(kafka_bootstrap, tmp_path_factory.mktemp("cc"), topic_prefix=f"cc{tag}.", processor_id=f"cc{tag}",
                    policy_args=policy_args, upstream_url=upstream, rollout_secret=ROLLOUT_SECRET,
                    intercept_args=intercept_args) as running:
        yield running


@pytest.fixture(scope="module")
def in_engine_stack(kafka_bootstrap, tmp_path_factory, vllm_middleware_engine):
    """Real vLLM started with ``--middleware producers.middleware.TokentrailMiddleware``: no proxy in between."""
    engine = vllm_middleware_engine
    prefix = MIDDLEWARE["TOKENTRAIL_TOPIC_PREFIX"]
    with LocalStack(kafka_bootstrap, tmp_path_factory.mktemp("mw"), topic_prefix=prefix,
                    processor_id=prefix.rstrip("."), control_token=MIDDLEWARE["TOKENTRAIL_CONTROL_TOKEN"],
                    upstream_url=engine.url, interceptor_in_engine=True,
                    rollout_secret=MIDDLEWARE["TOKENTRAIL_ROLLOUT_SECRET"]) as running:
        yield running


def _last_message_id(result) -> str | None:
    ids = [e["message"]["id"] for e in result.events if e.get("type") == "assistant" and e.get("message", {}).get("id")]
    return ids[-1] if ids else None


def _run_and_check(claude_stack: LocalStack, tmp_path) -> dict:
    from compose.harnesses.claude_code import run_claude_code

    rid = f"claude-{uuid.uuid4().hex[:8]}"
    result = run_claude_code(
        claude_stack.capture_base_url(rid).removesuffix("/v1"),
        "Check the working directory with one shell command, then summarise. #tool-calls=2",
        workdir=tmp_path, timeout=240, env={"ANTHROPIC_API_KEY": claude_stack.api_key(rid)},
    )
    assert result.ok, f"claude exited {result.returncode}: {result.stderr_tail}\n{result.stdout_tail}"
    tool_outputs = [r for r in result.tool_results()]
    assert len(tool_outputs) >= 2 and any("tokentrail" in str(r) for r in tool_outputs)
    claude_stack.finish(rid, {"reward": 1.0}, final_response_id=_last_message_id(result),
                        final_text=result.final_text)
    record = claude_stack.wait_rollouts([rid], timeout=90)[rid]
    assert_one_token_exact_chain(claude_stack, record)
    return record


def test_claude_code_session_is_captured_token_exact(claude, cc_stack, upstream, kafka_bootstrap, tmp_path):
    record = _run_and_check(cc_stack, tmp_path)
    if upstream is None:
        return
    # Real vLLM, prefix supply on: every turn after the first was generated from the supplied ids.
    log = EventLog(kafka_bootstrap, cc_stack.topics.rollout_events)
    try:
        calls = [e.decode().body for e in log.rollout_events(record["rollout_id"])]
    finally:
        log.close()
    calls = [c for c in calls if isinstance(c, CallCaptured)]
    assert len(calls) >= 3
    assert all(c.prefix_requested and c.prefix_supplied for c in calls[1:]), \
        [(c.model_call_id, c.prefix_requested, c.prefix_supplied) for c in calls]


@pytest.mark.vllm
def test_claude_code_streams_through_the_middleware_inside_vllm(claude, in_engine_stack, tmp_path):
    _run_and_check(in_engine_stack, tmp_path)
