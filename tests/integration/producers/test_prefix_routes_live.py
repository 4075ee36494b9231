"""Prefix supply's route, end to end on a real broker: a streamed, multi-turn, tool-using rollout (the OpenAI
SDK) through the interceptor (``--prefix-supply``) to the stand-in engine, folded, rebuilt and delivered.

On the 0.34 stand-in every call after the first took its supplied ids through render ->
/inference/v1/generate (``prefix_route`` on the captured event); on the 0.33 stand-in (as the 0.32 CPU
build answers) through kv_transfer_params on the chat route. Either way the delivered rollout is unmasked,
one chain, and token-exact: the engine's re-score of the delivered ids equals every captured log-prob.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from compose.harnesses.sdk import run_rollout
from compose.rig.stack import LocalStack
from consumers.replay.eventlog import EventLog
from schemas.records import CallCaptured, PrefixRoute
from tests.integration.engines import assert_one_token_exact_chain

pytestmark = [pytest.mark.integration, pytest.mark.real_broker]

ROUTES = {"0.34": PrefixRoute.GENERATE, "0.33": PrefixRoute.CHAT}


@pytest.mark.parametrize("release", sorted(ROUTES))
def test_a_streamed_rollout_with_prefix_supply_takes_the_engines_best_route_token_exact(
        kafka_bootstrap, tmp_path_factory, release):
    tag = f"pr{release.replace('.', '')}{uuid.uuid4().hex[:6]}"
    with LocalStack(kafka_bootstrap, tmp_path_factory.mktemp(tag), topic_prefix=f"{tag}.", processor_id=tag,
                    policy_args=("--vllm-release", release), intercept_args=("--prefix-supply",)) as stack:
        rid = f"{tag}-r"
        outcome = asyncio.run(run_rollout(stack.capture_base_url(rid), rid, "weather in Oslo?", tool_calls=2,
                                          stream=True))
        assert outcome.error is None and outcome.calls == 3, outcome
        stack.finish(rid, {"reward": 1.0}, final_response_id=outcome.final_response_id,
                     final_text=outcome.final_text)
        record = stack.wait_rollouts([rid], timeout=90)[rid]
        assert_one_token_exact_chain(stack, record)
        log = EventLog(kafka_bootstrap, stack.topics.rollout_events)
        try:
            calls = [e.decode().body for e in log.rollout_events(rid)]
        finally:
            log.close()
    calls = [c for c in calls if isinstance(c, CallCaptured)]
    assert len(calls) == 3 and all(c.facts.streamed for c in calls)
    assert calls[0].prefix_route == "" and not calls[0].prefix_supplied
    assert [(c.prefix_supplied, c.prefix_route) for c in calls[1:]] == [(True, ROUTES[release])] * 2
