"""No KV cache across policy versions: every request the engine gets carries a ``cache_salt`` naming the
current version (``producers.capture.call_versions.cache_salt``), a harness's own salt kept in front of it, and a part
continued after an abort has a salt of its own (it shares no KV with anything)."""

from __future__ import annotations

import httpx
import orjson
import pytest

from tests.unit.producers.conftest import vllm_chat_response
from tests.unit.producers.test_abort_continue import _body, _paused_mid_generation

CHAT = "/ng-rollout/{rid}/training-token-capture/v1/chat/completions"
ADMIN = {"authorization": "Bearer s3cret"}
MESSAGES = [{"role": "user", "content": "hello"}]


async def _salt_of_a_call(interceptor, upstream, rid: str, **extra) -> str:
    upstream.responses.append(httpx.Response(200, content=orjson.dumps(vllm_chat_response([1, 2, 3], [7, 8])),
                                             headers={"content-type": "application/json"}))
    r = await interceptor.post(CHAT.format(rid=rid), json={"model": "policy", "messages": MESSAGES, **extra})
    assert r.status_code == 200, r.text
    return upstream.requests[-1]["body"]["cache_salt"]


async def test_the_salt_names_the_version_and_changes_with_it(interceptor, upstream):
    before = await _salt_of_a_call(interceptor, upstream, "s0")
    assert await _salt_of_a_call(interceptor, upstream, "s1") == before  # one version: one cache partition
    r = await interceptor.post("/tokentrail/admin/policy-version", json={"version": "v7"}, headers=ADMIN)
    assert r.status_code == 200
    after = await _salt_of_a_call(interceptor, upstream, "s2")
    assert after != before and "v7" in after


async def test_a_harness_salt_is_kept_and_still_partitioned_by_version(interceptor, upstream):
    theirs = await _salt_of_a_call(interceptor, upstream, "h0", cache_salt="tenant-a")
    ours = await _salt_of_a_call(interceptor, upstream, "h1")
    assert theirs.startswith("tenant-a|") and theirs.endswith(ours)
    await interceptor.post("/tokentrail/admin/policy-version", json={"version": "v8"}, headers=ADMIN)
    assert await _salt_of_a_call(interceptor, upstream, "h2", cache_salt="tenant-a") != theirs


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_continued_part_is_salted_with_the_new_version(policy_rig, monkeypatch, stream):
    http, engine = await policy_rig(abort_policy="continue")
    salts: list[str] = []
    send = engine.send

    async def recording(request, **kwargs):
        if request.url.path == "/v1/chat/completions":
            salts.append(orjson.loads(request.content).get("cache_salt"))
        return await send(request, **kwargs)

    monkeypatch.setattr(engine, "send", recording)
    r = await _paused_mid_generation(http, engine, http.post(CHAT.format(rid=f"cont-{stream}"), json=_body(stream)))
    assert r.status_code == 200, r.text
    # The continuation was sent while the engine was paused, before v1 was announced: its salt is its own,
    # so none of its prefix is read from KV the v0 weights computed.
    first, second = salts[-2:]
    assert first.endswith(":v0") and "|continuation:" in second and second.endswith(":1"), salts
