"""One record per rollout attempt at the interceptor: the finish route and the capture prefix (issue 25, item 3).

The processor's fold is the authority (``tests/unit/processors/test_finish_once.py``); the interceptor
answers from what it acknowledged itself (``producers.http.finished``), so nothing it says 200 to is
dropped later: the same finish again is a 200 publishing nothing; a finish with another payload is a
409 naming the fields that differ; a capture call of a rollout it finished is a 409 naming the rule.

Before the fix every one of them was a 200: a second finish with another reward was published (and
delivered as a second, unmasked record), and calls of a finished (later retired) rollout were
captured and answered, then dead-lettered ``write_after_retire``.
"""

from __future__ import annotations

import asyncio
import sys
import tracemalloc

import httpx
import pytest

from schemas.records import RolloutFinished
from tests.unit.producers.conftest import vllm_chat_response

AUTH = {"authorization": "Bearer s3cret"}
R = "r-once"
FINISH = f"/rollouts/{R}/finish"
CHAT = f"/ng-rollout/{R}/training-token-capture/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "hi"}]


def finishes(publisher) -> list:
    return [e for e in publisher.events if isinstance(e.body, RolloutFinished)]


async def test_the_same_finish_again_is_a_200_that_publishes_nothing(interceptor, publisher):
    first = await interceptor.post(FINISH, json={"result": {"reward": 1}, "final_text": "42"}, headers=AUTH)
    assert first.status_code == 200, first.text
    again = await interceptor.post(FINISH, json={"final_text": "42", "result": {"reward": 1}}, headers=AUTH)
    assert again.status_code == 200, again.text
    assert again.json() == {"rollout_id": R, "event_id": first.json()["event_id"], "duplicate": True}
    assert len(finishes(publisher)) == 1


@pytest.mark.parametrize("second, field, value", [
    ({"result": {"reward": 0}, "final_text": "42"}, "result", '{"reward": 0}'),
    ({"result": {"reward": 1}, "final_text": "41"}, "final_text", "41"),
    ({"result": {"reward": 1}, "final_text": "42", "attempt": 1}, "attempt", "1"),
    ({"result": {"reward": 1}, "final_text": "42", "final_response_id": "chatcmpl-ttx"}, "final_response_id",
     "chatcmpl-ttx"),
])
async def test_a_finish_with_another_payload_is_a_409_naming_the_field_and_nothing_is_published(
        interceptor, publisher, second, field, value):
    first = await interceptor.post(FINISH, json={"result": {"reward": 1}, "final_text": "42"}, headers=AUTH)
    assert first.status_code == 200
    r = await interceptor.post(FINISH, json=second, headers=AUTH)
    assert r.status_code == 409, r.text
    message = r.json()["error"]["message"]
    for needle in (f"'{field}'", value, first.json()["event_id"], "One record per rollout attempt",
                   "new rollout id", "not published"):
        assert needle in message, (needle, message)
    assert len(finishes(publisher)) == 1


async def test_a_capture_call_of_a_finished_rollout_is_a_409_in_its_dialect_recording_and_forwarding_nothing(
        interceptor, publisher, upstream):
    upstream.responses.append(httpx.Response(200, json=vllm_chat_response([1, 2], [3, 4])))
    r = await interceptor.post(CHAT, json={"model": "m", "messages": MESSAGES})
    assert r.status_code == 200, r.text  # before the finish: captured
    fin = await interceptor.post(FINISH, json={"result": {"reward": 1}}, headers=AUTH)
    assert fin.status_code == 200
    recorded, forwarded = list(publisher.all), len(upstream.requests)
    r = await interceptor.post(CHAT, json={"model": "m", "messages": MESSAGES})
    assert r.status_code == 409, r.text
    message = r.json()["error"]["message"]
    for needle in (R, fin.json()["event_id"], "finished", "one attempt", "new rollout id", "nothing was recorded"):
        assert needle in message, (needle, message)
    r = await interceptor.post(f"/ng-rollout/{R}/training-token-capture/v1/messages",
                               json={"model": "m", "max_tokens": 8, "messages": MESSAGES})
    assert r.status_code == 409 and r.json()["type"] == "error" and "finished" in r.json()["error"]["message"]
    assert publisher.all == recorded and len(upstream.requests) == forwarded
    # Only what would be recorded is refused: read-only routes, the evaluation prefix and other rollouts go on.
    assert (await interceptor.get(f"/ng-rollout/{R}/training-token-capture/v1/models")).status_code == 200
    upstream.responses.append(httpx.Response(200, json=vllm_chat_response([1, 2], [3, 4])))
    assert (await interceptor.post(f"/ng-rollout/{R}/v1/chat/completions",
                                   json={"model": "m", "messages": MESSAGES})).status_code == 200
    upstream.responses.append(httpx.Response(200, json=vllm_chat_response([1, 2], [3, 4])))
    assert (await interceptor.post(CHAT.replace(R, "r-next"), json={"model": "m", "messages": MESSAGES})
            ).status_code == 200
    metrics = (await interceptor.get("/metrics")).text
    assert 'tokentrail_requests_refused_total{why="rollout_finished"} 2.0' in metrics


async def test_a_finish_that_was_not_durable_is_not_remembered(interceptor, publisher, upstream):
    publisher.fail = True
    r = await interceptor.post(FINISH, json={"result": {"reward": 1}}, headers=AUTH)
    assert r.status_code == 503
    publisher.fail = False
    upstream.responses.append(httpx.Response(200, json=vllm_chat_response([1, 2], [3, 4])))
    assert (await interceptor.post(CHAT, json={"model": "m", "messages": MESSAGES})).status_code == 200
    r = await interceptor.post(FINISH, json={"result": {"reward": 0}}, headers=AUTH)  # another payload: the first
    assert r.status_code == 200, r.text                                                 # never happened
    assert [e.body.result for e in finishes(publisher)] == [{"reward": 0}]


async def test_two_different_finishes_at_once_one_is_published_the_other_is_a_409(interceptor, publisher):
    publisher.gate = asyncio.Event()
    a = asyncio.create_task(interceptor.post(FINISH, json={"result": {"reward": 1}}, headers=AUTH))
    await asyncio.sleep(0.05)  # the first is in flight, waiting for its ack
    try:
        b = await asyncio.wait_for(interceptor.post(FINISH, json={"result": {"reward": 0}}, headers=AUTH), 10)
    finally:
        publisher.gate.set()
    assert b.status_code == 409 and "still being published" in b.json()["error"]["message"], b.text
    assert (await a).status_code == 200
    assert [e.body.result for e in finishes(publisher)] == [{"reward": 1}]


def test_the_book_is_bounded_oldest_first_and_small():
    from producers.http.finished import FinishedRollouts, payload_digest

    book = FinishedRollouts(max_rollouts=3)
    body = RolloutFinished(result_json='{"reward": 1}')
    for n in range(5):
        assert book.begin(f"r{n}", body) is None
        book.acknowledged(f"r{n}", body, f"ev{n}")
    assert len(book) == 3 and book.finished("r0") is None and book.finished("r4") == "ev4"
    with pytest.raises(ValueError, match="finished_max_rollouts"):
        FinishedRollouts(max_rollouts=0)
    # Measured: 10,000 acknowledged finishes of 29-character rollout ids, the ids' strings included
    # (producers.http.finished states the bound: about 230 bytes an entry, ~15 MB at the default 65,536).
    big = FinishedRollouts(max_rollouts=10_000)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for n in range(10_000):
        rid = f"run-20240601.task-{n:05d}-3.a1"
        big.begin(rid, body)
        big.acknowledged(rid, body, f"{n:032x}")
    per_entry = (tracemalloc.get_traced_memory()[0] - base) / 10_000
    tracemalloc.stop()
    assert per_entry < 260, per_entry
    assert sys.getsizeof(payload_digest(body)) < 80
