"""One record per rollout attempt, through the whole pipeline (issue 25, item 3): the real interceptor, fold
worker and consumer on the session's broker.

A rollout run with the OpenAI SDK and finished with reward 1 through the interceptor's route:

* the same finish again is a 200 publishing nothing, a finish with reward 0 a 409 naming 'result', and a
  call under the rollout's capture prefix a 409 naming the rule (nothing recorded or forwarded);
* a finish with reward 0 published straight to Kafka (``finish_rollout``, which the interceptor never
  sees) is dead-lettered by the fold, ``conflicting_finish`` before the rollout is retired,
  ``write_after_retire`` after, naming what happened;
* the consumer delivers exactly one record for the rollout, unmasked, with reward 1.

Before the fix the second finish was published and delivered as a second, unmasked record with
reward 0, and the late call was captured, answered 200 and dead-lettered.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import httpx
import pytest

from compose.harnesses.sdk import run_rollout
from producers.finish import finish_rollout
from tests.integration.deadletters import dead_letters

pytestmark = [pytest.mark.integration, pytest.mark.real_broker]


def test_a_rollout_finished_twice_and_called_again_is_delivered_once_with_its_first_result(stack, kafka_bootstrap):
    rid = f"once-{uuid.uuid4().hex[:8]}"
    base = stack.capture_base_url(rid)
    outcome = asyncio.run(run_rollout(base, rid, "What is the weather in Paris?", tool_calls=1))
    assert outcome.error is None, outcome.error
    finish_url = f"{stack.interceptor_url}/rollouts/{rid}/finish"
    auth = {"authorization": f"Bearer {stack.control_token}"}
    body = {"result": {"reward": 1}, "final_response_id": outcome.final_response_id,
            "final_text": outcome.final_text}
    with httpx.Client(timeout=30) as http:
        first = http.post(finish_url, json=body, headers=auth)
        assert first.status_code == 200, first.text
        again = http.post(finish_url, json=body, headers=auth)
        assert again.status_code == 200 and again.json()["duplicate"] is True, again.text
        assert again.json()["event_id"] == first.json()["event_id"]
        other = http.post(finish_url, json={**body, "result": {"reward": 0}}, headers=auth)
        assert other.status_code == 409 and "'result'" in other.json()["error"]["message"], other.text
        late = http.post(f"{base}/chat/completions", json={"model": "tokentrail-policy",
                                                           "messages": [{"role": "user", "content": "again"}]})
        assert late.status_code == 409 and "finished" in late.json()["error"]["message"], late.text
    records = stack.wait_rollouts([rid], timeout=90)
    assert records[rid]["mask_sample"] is False, records[rid]["mask_reasons"]
    assert records[rid]["result"] == {"reward": 1}

    # A finish the interceptor never sees: the fold refuses it (before or after the retirement).
    asyncio.run(finish_rollout(kafka_bootstrap, rid, {"reward": 0}, topic=stack.topics.rollout_events))
    ((raw, _),) = dead_letters(kafka_bootstrap, stack.topics.deadletter, rid.encode())
    headers = {k: v.decode() for k, v in raw.items()}
    reason, detail = headers["tokentrail-reason"], headers.get("tokentrail-detail", "")
    assert reason in ("conflicting_finish", "write_after_retire"), headers
    assert "new rollout id" in detail and ("'result'" in detail or "not delivered" in detail), detail
    time.sleep(2)  # what a second record would need to come through: none may
    mine = [r for r in stack.delivered() if r["rollout_id"] == rid]
    assert len(mine) == 1 and mine[0]["result"] == {"reward": 1}, [(r["version"], r["result"]) for r in mine]
    n_calls = mine[0]["_ng_token_capture"]["n_calls"]
    assert n_calls == outcome.calls, (n_calls, outcome.calls)  # the refused call was never captured
