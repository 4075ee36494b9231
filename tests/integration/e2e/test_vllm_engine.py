"""What only the real engine shows: re-rendering drift and prefix supply (random weights), an engine
paused mid-stream for a weight sync, and the engine's own limits (model names, context length)."""

from __future__ import annotations

import threading
import time
import uuid

import httpx
import openai
import pytest

from compose.engines.vllm_rig.engine import score_prompt
from compose.engines.vllm_rig.pace import paced
from compose.harnesses.sdk import WEATHER_TOOL
from compose.rig.stack import LocalStack
from consumers.replay.eventlog import EventLog
from schemas.records import CallCaptured, CallIncomplete

pytestmark = [pytest.mark.integration, pytest.mark.real_broker, pytest.mark.vllm]

TURNS = ("Tell me a story.", "And then?", "How does it end?")


@pytest.fixture
def random_engine(vllm_random_engine):
    return vllm_random_engine  # tests/integration/conftest.py: shared, weights put back by whoever changes them


def _stack(kafka_bootstrap, tmp_path_factory, engine, *intercept_args: str) -> LocalStack:
    tag = uuid.uuid4().hex[:8]
    return LocalStack(kafka_bootstrap, tmp_path_factory.mktemp("vllm"), topic_prefix=f"vl{tag}.",
                      processor_id=f"vl{tag}", upstream_url=engine.url, intercept_args=intercept_args)


def _three_turn_chat(stack: LocalStack, rid: str) -> tuple[str, str]:
    """Plain, streamed, plain again, tools offered; each answer echoed back as text. Returns the last id and text.

    ``enable_thinking: false`` is how Qwen3 clients turn reasoning off: the random weights never
    close a ``<think>`` block, and vLLM's qwen3 parser would otherwise take all of it for reasoning.
    """
    client = openai.OpenAI(base_url=stack.capture_base_url(rid), api_key="unused", max_retries=0, timeout=120)
    messages: list[dict] = []
    response_id, text = "", ""
    for turn, task in enumerate(TURNS):
        messages.append({"role": "user", "content": task})
        kwargs = dict(model="any-harness-name", messages=messages, max_tokens=12, tools=[WEATHER_TOOL],
                      extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        if turn == 1:
            parts = []
            for chunk in client.chat.completions.create(stream=True, **kwargs):
                response_id = chunk.id
                parts.extend(c.delta.content or "" for c in chunk.choices)
            text = "".join(parts)
        else:
            response = client.chat.completions.create(**kwargs)
            response_id, text = response.id, response.choices[0].message.content or ""
        assert text, f"turn {turn}: the engine answered no text"
        messages.append({"role": "assistant", "content": text})
    return response_id, text


def _captures(stack: LocalStack, kafka_bootstrap: str, rid: str) -> list[CallCaptured]:
    log = EventLog(kafka_bootstrap, stack.topics.rollout_events)
    try:
        bodies = [e.decode().body for e in log.rollout_events(rid)]
    finally:
        log.close()
    return [b for b in bodies if isinstance(b, CallCaptured)]


@pytest.mark.parametrize("supply", [False, True], ids=["echo", "prefix-supply"])
def test_random_weights_drift_masks_unless_the_prefix_is_supplied(kafka_bootstrap, tmp_path_factory, random_engine,
                                                                  supply):
    args = ("--prefix-supply",) if supply else ()
    with _stack(kafka_bootstrap, tmp_path_factory, random_engine, *args) as stack:
        rid = f"drift-{'ps' if supply else 'echo'}-{uuid.uuid4().hex[:6]}"
        response_id, text = _three_turn_chat(stack, rid)
        stack.finish(rid, {"reward": 1.0}, final_response_id=response_id, final_text=text)
        record = stack.wait_rollouts([rid], timeout=90)[rid]
        calls = _captures(stack, kafka_bootstrap, rid)
    m = record["_ng_token_capture"]
    assert len(calls) == 3 and m["n_calls"] == 3
    if not supply:
        # The echoed garbage does not re-tokenise to the sampled ids: every link fails verification.
        assert record["mask_sample"] is True
        assert "parent_digest_mismatch" in str(record["mask_reasons"]) + str(m), record["mask_reasons"]
        assert m["roots"] == 3
        return
    assert record["mask_sample"] is False, record["mask_reasons"]
    assert (m["roots"], m["chains"], m["delivered_fraction"]) == (1, 1, 1.0)
    first, *children = calls
    assert not first.prefix_requested
    for parent, child in zip(calls, children):
        # The engine generated from exactly the parent's sampled ids (it returned them as its prompt).
        assert child.prefix_requested and child.prefix_supplied
        assert child.parent_call_id == parent.model_call_id
    traj = record["trajectory"]
    generated = [i for i, bit in enumerate(traj["loss_mask"]) if bit]
    scored = score_prompt(random_engine.url, traj["token_ids"])
    assert [scored[i - 1] for i in generated] == traj["log_probs"]


def test_a_pause_mid_stream_records_the_call_aborted_and_the_harness_can_retry(kafka_bootstrap, tmp_path_factory,
                                                                              random_engine):
    with _stack(kafka_bootstrap, tmp_path_factory, random_engine) as stack:
        rid = f"pause-{uuid.uuid4().hex[:6]}"
        client = openai.OpenAI(base_url=stack.capture_base_url(rid), api_key="unused", max_retries=0, timeout=120)
        stream = client.chat.completions.create(model="any", messages=[{"role": "user", "content": "go"}],
                                                # Paced (20 s of decode at most), so the pause lands mid-generation
                                                # whatever the load: unpaced, 4,000 tokens were sometimes all
                                                # generated before it arrived, and 30,000 held a core for the
                                                # rest of the suite's broker and workers.
                                                max_tokens=4000, stream=True,
                                                extra_body={"ignore_eos": True, **paced(5)})
        chunks, error = 0, None
        paused = threading.Event()
        try:
            for _ in stream:
                chunks += 1
                # At the first chunk: the engine generates far ahead of what the client has read (the
                # interceptor and the socket buffer chunks), so a pause sent later can find it finished.
                if chunks == 1 and not paused.is_set():
                    threading.Thread(target=lambda: (httpx.post(f"{random_engine.url}/pause", timeout=30),
                                                     paused.set()), daemon=True).start()
        except openai.APIError as exc:
            error = exc
        assert paused.wait(30)
        httpx.post(f"{random_engine.url}/resume", timeout=30).raise_for_status()
        assert error is not None, f"the stream ended normally after {chunks} chunks"
        # After the sync the same request succeeds: the harness's retry works.
        retry = client.chat.completions.create(model="any", messages=[{"role": "user", "content": "go"}], max_tokens=4)
        assert retry.choices[0].message is not None
        stack.finish(rid, {"reward": 1.0})
        record = stack.wait_rollouts([rid], timeout=90)[rid]
        log = EventLog(kafka_bootstrap, stack.topics.rollout_events)
        try:
            bodies = [e.decode().body for e in log.rollout_events(rid)]
        finally:
            log.close()
    aborted = [b for b in bodies if isinstance(b, CallIncomplete)]
    captured = [b for b in bodies if isinstance(b, CallCaptured)]
    assert [b.reason for b in aborted] == ["aborted"], bodies
    assert len(captured) == 1 and len(captured[0].generation_token_ids) == 4  # only the retry was captured
    # The retry names the aborted call, so the rollout is delivered (an unretried abort masks aborted_by_update).
    assert captured[0].facts.retry_of == aborted[0].model_call_id
    assert record["mask_sample"] is False, record["mask_reasons"]


def test_unknown_model_names_and_oversized_max_tokens_are_served(kafka_bootstrap, tmp_path_factory, vllm_engine):
    with _stack(kafka_bootstrap, tmp_path_factory, vllm_engine) as stack:
        rid = f"limits-{uuid.uuid4().hex[:6]}"
        client = openai.OpenAI(base_url=stack.capture_base_url(rid), api_key="unused", max_retries=0, timeout=120)
        # Claude Code's numbers: a name the engine does not serve, max_tokens above max_model_len.
        response = client.chat.completions.create(model="claude-sonnet-4-5", max_tokens=128000,
                                                  messages=[{"role": "user", "content": "hi"}], tools=[WEATHER_TOOL])
        assert response.choices[0].message.tool_calls
        time.sleep(0.5)
        (call,) = _captures(stack, kafka_bootstrap, rid)
    assert call.facts.requested_model == "claude-sonnet-4-5" and call.facts.served_model == "tokentrail-tiny"
    # The harness's ask stays on record; what was sent fits the engine's window, and says so.
    assert call.facts.max_tokens == 128000 and call.facts.max_tokens_clamped
    assert call.facts.max_tokens_sent is not None and call.facts.max_tokens_sent <= 32768
