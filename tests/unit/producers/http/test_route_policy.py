"""The route table (producers.http.route_policy): what is captured, correlated, forwarded, refused (issue 15 items 2, 8).

Before it, every bare and every ``/ng-rollout/<id>/...`` path was forwarded: a harness could change the
engine's weights (``POST /ng-rollout/x/tokentrail/admin/weight-version``), reach vLLM's LoRA, sleep and
cache routes, mask any rollout with an unknown route, and learn the engine's address from a redirect.
"""

from __future__ import annotations

import httpx
import pytest

from producers.dialects.registry import DIALECTS
from producers.http.route_policy import ENGINE_ADMIN, READ_ONLY, Policy, decide
from producers.http.routing import PATH_RULE, Kind
from tests.unit.producers import raw_asgi

PREFIXES = {"bare": "", "eval": "/ng-rollout/r-1", "capture": "/ng-rollout/r-1/training-token-capture"}
AUTH = {"authorization": "Bearer s3cret"}


# -- the table, pure -------------------------------------------------------------------------

def concrete(pattern: str) -> str:
    """A path a harness sends for a registry path (a pattern's model and API version filled in)."""
    return pattern.replace("{version}", "v1beta").replace("{model}", "gemini-2.5-flash")


GENERATING = [concrete(p) for spec in DIALECTS for p in (spec.path, spec.stream_path) if p]


@pytest.mark.parametrize("path", GENERATING)
def test_generating_routes_are_captured_correlated_or_forwarded_by_prefix(path):
    assert decide(Kind.CAPTURE, "POST", path, DIALECTS).policy is Policy.CAPTURE
    assert decide(Kind.CAPTURE, "post", path + "/", DIALECTS).policy is Policy.CAPTURE
    assert decide(Kind.EVAL, "POST", path, DIALECTS).policy is Policy.CORRELATE
    assert decide(Kind.BARE, "POST", path, DIALECTS).policy is Policy.FORWARD
    wrong = decide(Kind.CAPTURE, "GET", path, DIALECTS)
    assert (wrong.policy, wrong.status) == (Policy.REFUSE, 405) and "takes POST only" in wrong.message


@pytest.mark.parametrize("kind", list(Kind))
@pytest.mark.parametrize(("method", "path"), [("GET", "/v1/models"), ("GET", "/v1/models/Qwen/Qwen3-0.6B"),
                                              ("HEAD", "/v1/models"), ("POST", "/v1/messages/count_tokens"),
                                              ("GET", "/health"), ("GET", "/v1/health"), ("POST", "/tokenize"),
                                              ("POST", "/detokenize")])
def test_read_only_routes_are_forwarded_on_every_prefix(kind, method, path):
    assert decide(kind, method, path, DIALECTS).policy is Policy.FORWARD


@pytest.mark.parametrize("kind", list(Kind))
@pytest.mark.parametrize("path", [*ENGINE_ADMIN, "/version", "/v1/completions", "/v1/embeddings", "/metrics",
                                  "/v1/chat/completions/render", "/", "/v1/modelsX"])
def test_everything_else_is_refused_naming_the_route_and_the_policy(kind, path):
    decision = decide(kind, "POST", path, DIALECTS)
    assert decision.policy is Policy.REFUSE and decision.status == 404
    assert f"POST {path}" in decision.message and "route policy: refuse" in decision.message
    assert "POST /v1/chat/completions" in decision.message  # it says what is allowed
    if path in ENGINE_ADMIN:
        assert "engine admin route" in decision.message


def test_forward_unknown_routes_opens_bare_paths_only():
    for path in ("/pause", "/v1/completions"):
        assert decide(Kind.BARE, "POST", path, DIALECTS, forward_unknown=True).policy is Policy.FORWARD
        for kind in (Kind.EVAL, Kind.CAPTURE):
            assert decide(kind, "POST", path, DIALECTS, forward_unknown=True).policy is Policy.REFUSE


def test_every_read_only_route_is_a_path_no_dialect_generates_at():
    assert all(DIALECTS.for_path(r.path) is None for r in READ_ONLY)


# -- through the interceptor -----------------------------------------------------------------

@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("path", ENGINE_ADMIN)
async def test_no_engine_admin_route_reaches_the_engine(interceptor, upstream, publisher, prefix, path):
    r = await interceptor.post(PREFIXES[prefix] + path, json={"version": 9, "lora_name": "x"}, headers=AUTH)
    assert r.status_code in (401, 404), r.text  # bare /tokentrail/admin/... is a control route: 404 with the token
    assert upstream.requests == [] and publisher.events == []


async def test_the_probe_cannot_change_the_reference_engines_weights(make_interceptor, publisher):
    http, app = await make_interceptor()
    r = await http.post("/ng-rollout/x/tokentrail/admin/weight-version", json={"version": 9})
    assert r.status_code == 404 and "engine admin route" in r.json()["error"]["message"]
    r = await http.post("/ng-rollout/x/training-token-capture/tokentrail/admin/weight-version", json={"version": 9})
    assert r.status_code == 404
    engine = await app.services.upstream.get("/tokentrail/admin/weight-version")
    assert engine.json() == {"weight_version": "default"}  # untouched
    assert publisher.events == []


async def test_an_unknown_route_cannot_mask_another_rollout(interceptor, upstream, publisher):
    for method in ("GET", "POST", "DELETE"):
        r = await interceptor.request(method, "/ng-rollout/victim/training-token-capture/version")
        assert r.status_code == 404, r.text
    assert publisher.events == [] and upstream.requests == []
    metrics = (await interceptor.get("/metrics")).text
    assert 'tokentrail_requests_refused_total{why="route"} 3.0' in metrics


async def test_a_refusal_is_in_the_callers_dialect(interceptor, publisher):
    r = await interceptor.get("/ng-rollout/r-1/training-token-capture/v1/messages")
    assert r.status_code == 405 and r.json()["type"] == "error"  # Anthropic's shape
    assert "GET /v1/messages" in r.json()["error"]["message"]


@pytest.mark.parametrize("prefix", PREFIXES)
async def test_read_only_routes_are_forwarded_and_record_nothing(interceptor, upstream, publisher, prefix):
    assert (await interceptor.get(PREFIXES[prefix] + "/v1/models")).status_code == 200
    r = await interceptor.post(PREFIXES[prefix] + "/v1/messages/count_tokens", json={"messages": []})
    assert r.status_code == 200 and upstream.requests[-1]["path"] == "/v1/messages/count_tokens"
    assert publisher.events == []


@pytest.mark.parametrize("status", [301, 302, 307, 308])
async def test_an_engine_redirect_is_a_502_without_the_engines_address(interceptor, upstream, status):
    upstream.responses.append(httpx.Response(status, headers={"location": "http://10.0.0.7:8000/v1/models"}))
    r = await interceptor.get("/ng-rollout/r-1/v1/models/")
    assert r.status_code == 502 and "location" not in r.headers
    assert f"redirect (HTTP {status})" in r.json()["error"]["message"] and "10.0.0.7" not in r.text


async def test_forward_unknown_routes_forwards_bare_paths_and_still_refuses_prefixed_ones(over_engine, publisher):
    from tests.unit.producers.fake_vllm import FakeVLLM

    engine = FakeVLLM()
    http, _ = await over_engine(engine, forward_unknown_routes=True)
    assert (await http.post("/v1/completions", json={"prompt": "x"})).status_code == 404  # the engine's own 404
    assert engine.paths() == ["/v1/completions"]
    for prefix in ("/ng-rollout/r-1", "/ng-rollout/r-1/training-token-capture"):
        r = await http.post(prefix + "/v1/completions", json={"prompt": "x"})
        assert r.status_code == 404 and "route policy: refuse" in r.text
    assert engine.paths() == ["/v1/completions"] and publisher.events == []


# -- Gemini's path patterns (the registry decides; issue: the Google dialect) ---------------------------------

GEMINI = "/v1beta/models/gemini-2.5-flash"


@pytest.mark.parametrize("kind", list(Kind))
def test_a_token_count_is_answered_on_every_prefix_and_takes_post_only(kind):
    for version in ("v1beta", "v1"):
        assert decide(kind, "POST", f"/{version}/models/gemini-2.5-flash:countTokens", DIALECTS).policy is Policy.COUNT
    wrong = decide(kind, "GET", GEMINI + ":countTokens", DIALECTS)
    assert (wrong.policy, wrong.status) == (Policy.REFUSE, 405)


@pytest.mark.parametrize("path", [
    "/v1beta/models/org/model-x:generateContent",  # the Gemini CLI puts `-m org/model-x` raw in the path
    "/v1beta/models/a:b:generateContent", "/v1beta/models/a b:generateContent", "/v1beta/models/..:generateContent",
    "/v1beta/models/.hidden:generateContent", "/v1beta/models/:generateContent", "/v1beta/models/m\\x:generateContent",
    "/v1beta/models/m:embedContent", "/vbeta/models/m:generateContent", "/v1beta/tunedModels/m:generateContent",
    "/x/v1beta/models/m:generateContent",
])
def test_a_model_or_method_outside_the_patterns_is_refused(path):
    decision = decide(Kind.CAPTURE, "POST", path, DIALECTS)
    assert (decision.policy, decision.status) == (Policy.REFUSE, 404), path
    assert "POST /{version}/models/{model}:generateContent" in decision.message  # it says what is allowed


@pytest.mark.parametrize("raw", [
    b"/v1beta/models/org%2Fmodel:generateContent", b"/v1beta/models/gemini%3AcountTokens:generateContent",
    b"/v1beta/models/m%5Cx:streamGenerateContent", b"/v1beta/models/%2e%2e:generateContent",
    b"/v1beta/models/m%20x:countTokens",
])
async def test_an_encoded_separator_in_the_model_is_refused_and_nothing_is_recorded(app, upstream, publisher, raw):
    r = await raw_asgi.call(app, "POST", b"/ng-rollout/r-1/training-token-capture" + raw,
                            body=b'{"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}')
    assert r.status == 404, (r.status, r.body[:300])
    assert r.json()["error"]["status"] == "NOT_FOUND"  # Google's shape: the path names the dialect
    assert upstream.requests == [] and publisher.all == []


@pytest.mark.parametrize("raw", [b"/v1beta/models/%2e%2e/%2e%2e/sleep:generateContent",
                                 b"/v1beta/models/..%2f..%2fsleep:streamGenerateContent"])
async def test_a_dot_segment_before_a_gemini_method_is_the_path_rules_400(app, upstream, publisher, raw):
    r = await raw_asgi.call(app, "POST", b"/ng-rollout/r-1/training-token-capture" + raw, body=b"{}")
    assert r.status == 400 and PATH_RULE in r.json()["error"]["message"]
    assert upstream.requests == [] and publisher.all == []
