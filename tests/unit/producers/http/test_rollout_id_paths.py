"""A rollout id is rejected, never rewritten, whatever the path encoding (ARCHITECTURE §4).

Regression: Starlette's ``request.url`` re-parses the path with ``urllib.parse.urlsplit``, which
deletes tab, CR and LF, so ``/ng-rollout/tab%09x1/...`` was captured (and finished) as rollout
``tabx1``; ``a%2Fb`` was read as rollout ``a`` with a path ``b/...``.
"""

from __future__ import annotations

import httpx
import pytest

from producers.http.routing import Kind, parse_route
from schemas.errors import ContractError
from schemas.ids import ROLLOUT_ID_RULE
from schemas.records import RolloutFinished
from tests.unit.producers import raw_asgi
from tests.unit.producers.conftest import vllm_chat_response

AUTH = [(b"authorization", b"Bearer s3cret")]
CHAT_BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
# Raw ids that decode to something outside the rule; each must be refused, on every route.
BAD_RAW_IDS = [b"tab%09x1", b"cr%0Dx1", b"lf%0Ax1", b"a%2Fb", b"sp%20x", b"%09lead", b"trail%0A", b"dot%00"]


def _names_the_rule(response: raw_asgi.RawResponse) -> str:
    payload = response.json()
    message = payload["error"]["message"]
    assert response.status == 400, response.body
    assert ROLLOUT_ID_RULE in message and "rejected, not rewritten" in message
    return message


@pytest.mark.parametrize("raw_id", BAD_RAW_IDS)
@pytest.mark.parametrize("route", [b"/training-token-capture/v1/chat/completions", b"/v1/chat/completions",
                                   b"/training-token-capture/v1/models"])
async def test_capture_and_eval_routes_refuse_an_id_whose_decoded_form_breaks_the_rule(app, publisher, upstream,
                                                                                   raw_id, route):
    upstream.responses.append(httpx.Response(200, json=vllm_chat_response([1], [2])))
    r = await raw_asgi.call(app, "POST", b"/ng-rollout/" + raw_id + route, body=CHAT_BODY)
    _names_the_rule(r)
    assert publisher.events == [] and upstream.requests == []


@pytest.mark.parametrize("raw_id", BAD_RAW_IDS)
async def test_the_finish_route_refuses_them_too(app, publisher, raw_id):
    r = await raw_asgi.call(app, "POST", b"/rollouts/" + raw_id + b"/finish", body=b'{"result": {"reward": 1}}',
                            headers=AUTH)
    _names_the_rule(r)
    assert publisher.events == []


async def test_the_probe_case_through_a_real_client_is_refused_not_merged(app, publisher):
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://tt") as http:
        r = await http.post("/ng-rollout/tab%09x1/training-token-capture/v1/chat/completions",
                            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 400 and "'tab\\tx1'" in r.json()["error"]["message"]
        r = await http.post("/rollouts/tab%09x1/finish", json={}, headers={"authorization": "Bearer s3cret"})
        assert r.status_code == 400 and "'tab\\tx1'" in r.json()["error"]["message"]
    assert publisher.events == []


async def test_an_anthropic_caller_gets_the_refusal_in_anthropic_shape(app, publisher):
    r = await raw_asgi.call(app, "POST", b"/ng-rollout/lf%0Ax/training-token-capture/v1/messages",
                            body=b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}')
    payload = r.json()
    assert r.status == 400 and payload["type"] == "error" and payload["error"]["type"] == "invalid_request_error"
    assert ROLLOUT_ID_RULE in payload["error"]["message"]


async def test_a_valid_id_still_captures_and_finishes_under_its_own_name(app, publisher, upstream):
    upstream.responses.append(httpx.Response(200, json=vllm_chat_response([1], [2])))
    r = await raw_asgi.call(app, "POST", b"/ng-rollout/step1.task-2_r3/training-token-capture/v1/chat/completions",
                            body=CHAT_BODY)
    assert r.status == 200
    r = await raw_asgi.call(app, "POST", b"/rollouts/step1.task-2_r3/finish", body=b"{}", headers=AUTH)
    assert r.status == 200 and r.json()["rollout_id"] == "step1.task-2_r3"
    assert [e.rollout_id for e in publisher.events] == ["step1.task-2_r3"] * 2
    assert isinstance(publisher.events[-1].body, RolloutFinished)


def test_parse_route_checks_the_raw_segment():
    assert parse_route("/ng-rollout/abc/v1/models", b"/ng-rollout/abc/v1/models").rollout_id == "abc"
    # percent-encoding of allowed characters decodes to the same id: accepted as that id
    assert parse_route("/ng-rollout/abc/v1/models", b"/ng-rollout/%61bc/v1/models").rollout_id == "abc"
    with pytest.raises(ContractError, match="'a/b'"):
        parse_route("/ng-rollout/a/b/v1/models", b"/ng-rollout/a%2Fb/v1/models")
    with pytest.raises(ContractError, match="must match"):
        parse_route("/ng-rollout/ab/v1/models", b"/ng-rollout/a%0Db/v1/models")
    # no raw path (an ASGI server may omit it): the decoded path alone decides
    assert parse_route("/ng-rollout/abc/training-token-capture/v1/models").kind is Kind.CAPTURE
    with pytest.raises(ContractError, match="must match"):
        parse_route("/ng-rollout/a\tb/v1/models")


def test_finish_rollout_id_reads_the_raw_segments():
    from producers.http.routing import finish_rollout_id

    assert finish_rollout_id("/rollouts/r-1/finish", b"/rollouts/r-1/finish") == "r-1"
    assert finish_rollout_id("/rollouts/r-1/finish/", None) == "r-1"
    assert finish_rollout_id("/rollouts/r-1/other", b"/rollouts/r-1/other") is None
    with pytest.raises(ContractError, match="'a/b'"):
        finish_rollout_id("/rollouts/a/b/finish", b"/rollouts/a%2Fb/finish")
    with pytest.raises(ContractError, match="must match"):
        finish_rollout_id("/rollouts/a\nb/finish", None)
