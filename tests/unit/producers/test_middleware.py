"""The vLLM middleware entry point: same capture core, in-process upstream, true streaming."""

from __future__ import annotations

import asyncio
import json
import logging

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route

from compose.engines.policy import create_app
from producers.capture.spool import Spool
from producers.http.inprocess import StreamingASGITransport
from producers.middleware import TokentrailMiddleware
from producers.middleware_env import ENV_SETTINGS, claim_spool_dir, settings_from_env
from producers.settings import InterceptorSettings
from schemas.codec import encode_event
from schemas.errors import ConfigError
from schemas.records import CallCaptured, CallIncomplete
from tests.factories import event, incomplete

SETTINGS = InterceptorSettings(upstream_url="http://in-process", bootstrap="unused:9092")


def test_settings_come_from_the_environment_and_are_validated():
    with pytest.raises(ConfigError, match="TOKENTRAIL_BOOTSTRAP"):
        settings_from_env({})
    with pytest.raises(ConfigError, match="sampling"):
        settings_from_env({"TOKENTRAIL_BOOTSTRAP": "k:9092", "TOKENTRAIL_SAMPLING": '{"temprature": 1}'})
    s = settings_from_env({"TOKENTRAIL_BOOTSTRAP": "k:9092", "TOKENTRAIL_TOPIC_PREFIX": "x.",
                           "TOKENTRAIL_PREFIX_SUPPLY": "1"})
    assert s.topics.rollout_events == "x.tokentrail.rollout-events" and s.prefix_supply


async def test_wrapped_policy_server_serves_bare_routes_and_captures_prefixed_ones(publisher):
    app = TokentrailMiddleware(create_app(), settings=SETTINGS, publisher=publisher)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://vllm") as http:
        assert (await http.get("/v1/models")).status_code == 200
        plain = await http.post("/v1/chat/completions", json={"model": "tokentrail-policy",
                                                              "messages": [{"role": "user", "content": "x"}],
                                                              "return_token_ids": True})
        assert "prompt_token_ids" in plain.json() and publisher.events == []  # untouched vLLM behaviour
        r = await http.post("/ng-rollout/mw-1/training-token-capture/v1/chat/completions",
                            json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 200 and "prompt_token_ids" not in r.json()
        (event,) = publisher.events
        assert isinstance(event.body, CallCaptured) and event.rollout_id == "mw-1"
        metrics = await http.get("/tokentrail/metrics")
        assert b"tokentrail_calls_captured_total 1.0" in metrics.content
    await app.interceptor.shutdown()


def _gated_engine(gate: asyncio.Event):
    """A stand-in vLLM: streams one chunk, waits for the gate, then finishes."""

    def chunk(**choice):
        return b"data: " + json.dumps({"id": "x", "object": "chat.completion.chunk", "model": "m",
                                        "choices": [{"index": 0, **choice}]}).encode() + b"\n\n"

    async def app(scope, receive, send):
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        first = json.loads(chunk(delta={"role": "assistant", "content": ""})[6:])
        first["prompt_token_ids"] = [1, 2]
        await send({"type": "http.response.body", "body": b"data: " + json.dumps(first).encode() + b"\n\n",
                    "more_body": True})
        await send({"type": "http.response.body", "more_body": True, "body": chunk(
            delta={"content": "he"}, token_ids=[5], logprobs={"content": [{"token": "he", "logprob": -0.5}]})})
        await gate.wait()
        await send({"type": "http.response.body", "more_body": True, "body": chunk(
            delta={"content": "llo"}, token_ids=[6], logprobs={"content": [{"token": "llo", "logprob": -0.25}]},
            finish_reason="stop")})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})

    return app


async def test_chunks_reach_the_client_before_the_engine_finishes(publisher):
    gate = asyncio.Event()
    app = TokentrailMiddleware(_gated_engine(gate), settings=SETTINGS, publisher=publisher)
    async with httpx.AsyncClient(transport=StreamingASGITransport(app), base_url="http://vllm") as http:
        async with http.stream("POST", "/ng-rollout/mw-2/training-token-capture/v1/chat/completions",
                               json={"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}) as r:
            lines = r.aiter_lines()
            seen = []
            async for line in lines:
                if line.startswith("data:"):
                    seen.append(line)
                if '"he"' in line:
                    break
            assert publisher.events == [], "mid-stream: nothing captured yet, yet the client has the text"
            gate.set()
            rest = [line async for line in lines if line.startswith("data:")]
    assert rest[-1] == "data: [DONE]"
    (event,) = publisher.events
    assert event.body.generation_token_ids == [5, 6] and event.body.generation_log_probs == [-0.5, -0.25]
    await app.interceptor.shutdown()


# -- registered the way vLLM registers it: app.add_middleware(cls) -----------------------------

CAPTURE = "/ng-rollout/{rid}/training-token-capture/v1/chat/completions"


class _ReadsAppState:
    """A route like every vLLM handler: it finds its engine through ``request.app.state``."""

    def __init__(self) -> None:
        self.states: list[dict] = []

    async def __call__(self, scope, receive, send):
        request = Request(scope, receive)
        engine = request.app.state.engine_client  # KeyError('app') when the scope has no "app"
        self.states.append(dict(scope.get("state") or {}))
        if engine == "broken":
            raise KeyError("engine_client")
        await engine(scope, receive, send)


def _vllm_like(engine: object = None) -> tuple[Starlette, _ReadsAppState]:
    handler = _ReadsAppState()
    app = Starlette(routes=[Route("/v1/chat/completions", handler, methods=["POST"]),
                            Route("/v1/models", handler, methods=["GET"])])
    app.state.engine_client = create_app() if engine is None else engine
    return app, handler


def _middleware_of(app: Starlette) -> TokentrailMiddleware:
    layer = app.middleware_stack
    while not isinstance(layer, TokentrailMiddleware):
        layer = layer.app
    return layer


async def _lifespan(app, *, then_shutdown: bool = False) -> list[dict]:
    """Drive the ASGI lifespan protocol like uvicorn; returns what the app sent."""
    incoming: asyncio.Queue = asyncio.Queue()
    sent: list[dict] = []
    incoming.put_nowait({"type": "lifespan.startup"})
    if then_shutdown:
        incoming.put_nowait({"type": "lifespan.shutdown"})

    async def send(message):
        sent.append(message)

    task = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {"shared": 1}},
                                   incoming.get, send))
    if then_shutdown:
        await asyncio.wait_for(task, 10)
    else:
        for _ in range(200):
            if sent:
                break
            await asyncio.sleep(0.01)
        task.cancel()
    return sent


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
async def test_added_with_add_middleware_the_engine_still_finds_request_app(publisher, stream):
    app, handler = _vllm_like()
    app.add_middleware(TokentrailMiddleware, settings=SETTINGS, publisher=publisher)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://vllm") as http:
        assert (await http.get("/ng-rollout/mw-3/training-token-capture/v1/models")).status_code == 200
        r = await http.post(CAPTURE.format(rid="mw-3"), json={
            "model": "tokentrail-policy", "messages": [{"role": "user", "content": "x"}], "stream": stream})
        assert r.status_code == 200, r.text
        if stream:
            assert r.text.rstrip().endswith("data: [DONE]")
    captured = [e.body for e in publisher.events if isinstance(e.body, CallCaptured)]
    assert len(captured) == 1 and captured[0].generation_token_ids
    assert handler.states  # the handler ran in-process, through request.app
    await _middleware_of(app).interceptor.shutdown()


async def test_an_engine_exception_is_an_upstream_error_not_a_500_without_evidence(publisher):
    app, _ = _vllm_like(engine="broken")
    app.add_middleware(TokentrailMiddleware, settings=SETTINGS, publisher=publisher)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://vllm") as http:
        r = await http.post(CAPTURE.format(rid="mw-4"), json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 502 and "KeyError" in r.json()["error"]["message"]
    (marker,) = [e.body for e in publisher.events]
    assert isinstance(marker, CallIncomplete) and marker.reason == "upstream_error"
    await _middleware_of(app).interceptor.shutdown()


async def test_the_lifespan_state_reaches_the_in_process_request(publisher):
    app, handler = _vllm_like()
    app.add_middleware(TokentrailMiddleware, settings=SETTINGS, publisher=publisher)
    assert (await _lifespan(app))[0]["type"] == "lifespan.startup.complete"
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://vllm") as http:
        await http.post(CAPTURE.format(rid="mw-5"), json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert handler.states[-1] == {"shared": 1}
    await _middleware_of(app).interceptor.shutdown()


async def test_missing_bootstrap_keeps_vllm_serving_and_answers_capture_calls_503(monkeypatch, caplog):
    for name, _, _ in ENV_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    app, _ = _vllm_like()
    app.add_middleware(TokentrailMiddleware)  # exactly what vllm serve --middleware does
    with caplog.at_level(logging.ERROR, logger="tokentrail.interceptor"):
        # under uvicorn's lifespan="auto" a raise here would turn every request into a 500
        assert (await _lifespan(app))[0]["type"] == "lifespan.startup.complete"
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://vllm") as http:
            plain = await http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
            assert plain.status_code == 200  # vLLM's own routes keep working
            for path in (CAPTURE.format(rid="mw-6"), "/ng-rollout/mw-6/training-token-capture/v1/messages"):
                r = await http.post(path, json={"model": "m", "max_tokens": 5,
                                                "messages": [{"role": "user", "content": "x"}]})
                assert r.status_code == 503 and "TOKENTRAIL_BOOTSTRAP" in r.text
    assert len([rec for rec in caplog.records if "TOKENTRAIL_BOOTSTRAP" in rec.getMessage()]) == 1


def test_every_environment_variable_names_a_setting():
    assert all(field in InterceptorSettings.model_fields for _, field, _ in ENV_SETTINGS)
    assert len({name for name, _, _ in ENV_SETTINGS}) == len(ENV_SETTINGS)
    s = settings_from_env({"TOKENTRAIL_BOOTSTRAP": "k:9092", "TOKENTRAIL_UPSTREAM_MODEL": "Qwen/Qwen3-0.6B",
                           "TOKENTRAIL_DELTA_RECORDS": "0", "TOKENTRAIL_SPOOL_DIR": "/tmp/x"})
    assert s.upstream_model == "Qwen/Qwen3-0.6B" and s.delta_records is False and str(s.spool_dir) == "/tmp/x"
    assert settings_from_env({"TOKENTRAIL_BOOTSTRAP": "k:9092"}).upstream_model is None
    s = settings_from_env({"TOKENTRAIL_BOOTSTRAP": "k:9092", "TOKENTRAIL_UPSTREAM_API_KEY": "sk-engine",
                           "TOKENTRAIL_LOGPROBS_MODE": "processed_logprobs"})
    assert s.upstream_api_key.get_secret_value() == "sk-engine" and s.logprobs_mode == "processed_logprobs"
    with pytest.raises(ConfigError, match="TOKENTRAIL_LOGPROBS_MODE"):
        settings_from_env({"TOKENTRAIL_BOOTSTRAP": "k:9092", "TOKENTRAIL_LOGPROBS_MODE": "raw_logits"})
    with pytest.raises(ConfigError, match="TOKENTRAIL_PREFIX_SUPPLY"):
        settings_from_env({"TOKENTRAIL_BOOTSTRAP": "k:9092", "TOKENTRAIL_PREFIX_SUPPLY": "maybe"})


# -- one spool per API server process --------------------------------------------------------

def _spool_with(directory, n: int) -> list[bytes]:
    values = [encode_event(event("left", incomplete(f"{i:032x}"))) for i in range(n)]
    spool = Spool(directory)
    for value in values:
        spool.append(SETTINGS.topics.rollout_events, b"left", value)
    spool.close()
    return values


def test_processes_claim_their_own_spool_and_a_left_one_is_preferred(tmp_path):
    first = Spool(claim_spool_dir(tmp_path))  # held, like a live process
    assert first.dir == tmp_path / "api-0"
    second_dir = claim_spool_dir(tmp_path)
    assert second_dir == tmp_path / "api-1"
    _spool_with(tmp_path / "api-2", 2)  # a process that died with events spooled
    assert claim_spool_dir(tmp_path) == tmp_path / "api-2"
    assert claim_spool_dir(tmp_path, frozenset({tmp_path / "api-2"})) == tmp_path / "api-1"  # free, empty
    first.close()


async def test_middlewares_sharing_a_spool_dir_start_and_a_restart_drains_the_dead_one_in_order(tmp_path, publisher):
    from tests.unit.producers.conftest import RecordingPublisher

    settings = SETTINGS.model_copy(update={"spool_dir": tmp_path})
    left = _spool_with(tmp_path / "api-1", 3)
    alive = [TokentrailMiddleware(create_app(), settings=settings, publisher=RecordingPublisher()) for _ in range(2)]
    for mw in alive:
        await mw._ensure_started()  # each API server process of a data-parallel vLLM
    spools = {mw.interceptor.core.writer._spool.dir for mw in alive}
    assert spools == {tmp_path / "api-0", tmp_path / "api-1"}
    drained = next(mw for mw in alive if mw.interceptor.core.writer._spool.dir == tmp_path / "api-1")
    for _ in range(250):
        if not drained.interceptor.core.writer.spooled:
            break
        await asyncio.sleep(0.02)
    assert [raw[2] for raw in drained.interceptor._publisher.raw] == left  # in order, once
    for mw in alive:
        await mw.interceptor.shutdown()


async def test_an_engine_that_raises_mid_stream_interrupts_the_capture(publisher):
    async def engine(scope, receive, send):
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        first = {"id": "x", "object": "chat.completion.chunk", "model": "m", "prompt_token_ids": [1, 2],
                 "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
        await send({"type": "http.response.body", "body": b"data: " + json.dumps(first).encode() + b"\n\n",
                    "more_body": True})
        raise RuntimeError("engine core died")

    app = TokentrailMiddleware(engine, settings=SETTINGS, publisher=publisher)
    async with httpx.AsyncClient(transport=StreamingASGITransport(app), base_url="http://vllm") as http:
        r = await http.post(CAPTURE.format(rid="mw-7"), json={"model": "m", "messages": [{"role": "user", "content": "x"}],
                                                              "stream": True})
    assert '"error"' in r.text and "[DONE]" not in r.text.split('"error"')[0]
    (marker,) = [e.body for e in publisher.events]
    assert isinstance(marker, CallIncomplete) and marker.reason == "stream_interrupted"
    assert "engine core died" in marker.detail
    await app.interceptor.shutdown()


async def test_in_engine_rollout_ids_are_checked_on_the_raw_path(publisher):
    from tests.unit.producers.raw_asgi import call

    app, _ = _vllm_like()
    app.add_middleware(TokentrailMiddleware, settings=SETTINGS, publisher=publisher)
    body = json.dumps({"model": "tokentrail-policy", "messages": [{"role": "user", "content": "x"}]}).encode()
    bad = await call(app, "POST", b"/ng-rollout/a%2Fb/training-token-capture/v1/chat/completions", body=body)
    assert bad.status == 400 and "rollout" in bad.body.decode().lower()
    good = await call(app, "POST", b"/ng-rollout/mw-raw/training-token-capture/v1/chat/completions", body=body)
    assert good.status == 200, good.body
    assert not [e for e in publisher.events if e.rollout_id in ("a", "a/b")]
    await _middleware_of(app).interceptor.shutdown()


async def test_in_engine_vllm_admin_routes_under_the_prefix_are_refused_never_run(publisher):
    # The same route table as the proxy (producers.http.route_policy): vLLM's admin routes reached through
    # /ng-rollout/ are refused; vLLM's own bare routes stay vLLM's (issue 15 item 2).
    ran: list[str] = []

    async def admin(request):
        ran.append(request.url.path)
        from starlette.responses import JSONResponse
        return JSONResponse({"ok": True})

    app, _ = _vllm_like()
    for path in ("/pause", "/sleep", "/v1/load_lora_adapter", "/collective_rpc", "/reset_prefix_cache"):
        app.router.routes.append(Route(path, admin, methods=["POST"]))
    app.add_middleware(TokentrailMiddleware, settings=SETTINGS, publisher=publisher)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://vllm") as http:
        for prefix in ("/ng-rollout/mw-5", "/ng-rollout/mw-5/training-token-capture"):
            for path in ("/pause", "/sleep", "/v1/load_lora_adapter", "/collective_rpc", "/reset_prefix_cache"):
                r = await http.post(prefix + path, json={"lora_name": "x", "lora_path": "/tmp/x"})
                assert r.status_code == 404 and "route policy: refuse" in r.text, r.text
        assert ran == [] and publisher.events == []
        assert (await http.post("/pause", json={})).status_code == 200  # bare: vLLM's own route, as without us
    assert ran == ["/pause"]
    await _middleware_of(app).interceptor.shutdown()


def test_the_deploying_page_names_every_middleware_variable():
    from pathlib import Path

    from producers.middleware_env import ENV_SETTINGS

    page = (Path(__file__).resolve().parents[3] / "docs" / "deploying.md").read_text()
    missing = [name for name, *_ in ENV_SETTINGS if f"`{name}`" not in page]
    assert not missing, f"docs/deploying.md's in-engine middleware paragraph lacks {missing}"
