"""The reference policy server: a Starlette app that answers like vLLM 0.34 (or 0.33: ``settings.vllm_release``).

Routes:

* ``POST /v1/chat/completions``   non-streaming and SSE (``stream: true``), ``n`` >= 1
* ``POST /v1/chat/completions/render``   the engine request, tokens in (``render.py``)
* ``POST /inference/v1/generate``   tokens in, a derendered chat stream out (``generate.py``; 0.34)
* ``GET  /v1/models``, ``GET /health``, ``GET /version``
* ``POST /tokenize``, ``POST /detokenize``               (vLLM shapes)
* vLLM's dev-mode RL routes and tokentrail's score / weight-version routes (``admin.py``)
* with ``sleep_mode``: 0.34's ``/checkpoint/prepare|restore|status`` (``checkpoint.py``)

Faults (server-wide via ``PolicySettings.faults``, or per request with a marker
``[[fault:NAME]]`` in the last message's content): ``5xx`` answers HTTP 500 with a vLLM
error body; ``no_token_ids`` omits token ids even when asked; ``stall`` makes a stream
send the first chunk plus ``stall_after_chunks`` chunks, then hang until the client
disconnects (or, with ``stall_seconds``, abort the connection after that long);
``drift`` makes the sampler emit one non-canonical split so re-tokenizing the echoed
text differs; ``repetition`` ends the answer with finish_reason ``"repetition"``.
``drop_reasoning_in_history`` is a template drift (see ``template.py``).

Guarantees: every error is a vLLM body ``{"error": {message, type, param, code}}`` (an
unknown route or method: FastAPI's ``{"detail": ...}``); a request body must be sent as
``application/json``; streamed ``token_ids`` concatenate to the non-streaming
``token_ids`` of the same request, and streamed log-probs equal the non-streaming ones.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from compose.engines.policy import admin, checkpoint, generate, render, template
from compose.engines.policy.agent import Generation
from compose.engines.policy.engine import ChatJob, PolicyEngine
from compose.engines.policy.protocol import VLLM_VERSION, VLLM_VERSIONS, ResponseShaper, completion_json
from compose.engines.policy.settings import PolicySettings
from compose.engines.policy.stream import StalledStreamAborted, stream_chat
from compose.engines.policy.validation import JSON_ONLY, RequestError, validation_error

__all__ = ["StalledStreamAborted", "VLLM_VERSION", "create_app"]
_error = admin.error_response


async def json_body(request: Request) -> Any:
    """vLLM's ``validate_json_request`` plus FastAPI's body parsing, with their error texts."""
    media_type = request.headers.get("content-type", "").lower().split(";", 1)[0]
    if media_type != "application/json":
        raise RequestError(JSON_ONLY, err_type="Bad Request")
    raw = await request.body()
    if not raw:
        raise validation_error("missing", "body", "Field required", None)
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise validation_error("json_invalid", f"body.{getattr(exc, 'pos', 0)}", "JSON decode error", {},
                               {"error": getattr(exc, "msg", str(exc))}) from None


def _request_id(request: Request, body: Any) -> str:
    header = request.headers.get("x-request-id")
    if header is not None:
        return header
    given = body.get("request_id") if isinstance(body, dict) else None
    return given if isinstance(given, str) else uuid.uuid4().hex


# A non-streamed generation is paced in steps of about this long, not a timer per token: 512 timers
# per call at 5 ms a token were a fifth of the server's CPU at 64 calls in flight. Nobody sees the
# tokens of a step apart, so only when a pause, an abort or a new weight version lands can move, by
# less than a step: the tokens of a step are generated under the label current at its end.
PACING_STEP_S = 0.02


async def _decode(engine: PolicyEngine, job: ChatJob, flight: Any, gens: list[Generation],
                  ms_per_token: float) -> tuple[list[Generation], int]:
    """Deliver a non-streamed generation over time: the generations as the weight versions
    current at each token made them (``PolicyEngine.at_token``), and how many tokens were produced."""
    if not ms_per_token and not engine.control.paused:
        return gens, max(len(g.token_ids) for g in gens)
    if not await flight.admit():
        return gens, 0
    per_step = max(1, int(PACING_STEP_S * 1000 / ms_per_token)) if ms_per_token else 1
    t = 0
    while t < (total := max(len(g.token_ids) for g in gens)):
        step = min(per_step, total - t)
        if not await flight.step(ms_per_token * step):
            return gens, t
        for _ in range(step):
            gens = engine.at_token(job, gens, t)
            t += 1
    return gens, t


def create_app(settings: PolicySettings | None = None) -> Starlette:
    """The ASGI app; usable in-process with ``httpx.ASGITransport`` or under uvicorn."""
    settings = settings or PolicySettings()
    engine = PolicyEngine(settings)
    control = engine.control
    renders = generate.RenderMemory()

    async def chat_completions(request: Request) -> Response:
        try:
            body = await json_body(request)
            job: ChatJob = engine.prepare(body)
        except RequestError as exc:
            return _error(exc)
        if "5xx" in job.faults:
            return _error(RequestError("injected upstream failure (fault: 5xx)", 500, "InternalServerError"))
        if job.engine_error is not None and not job.stream:
            return _error(job.engine_error)
        request_id = f"chatcmpl-{_request_id(request, body)}"
        shaper = ResponseShaper(engine, job, engine.generate_all(job), request_id, int(time.time()),
                                settings.served_model_name)
        if job.stream:
            async def flown():
                async with control.flight(request_id) as flight:
                    async for piece in stream_chat(shaper, flight, settings):
                        yield piece

            return StreamingResponse(flown(), media_type="text/event-stream")
        async with control.flight(request_id) as flight:
            shaper.gens, produced = await _decode(engine, job, flight, shaper.gens, settings.decode_ms_per_token)
        if flight.aborted:
            shaper.gens = [g.cut(produced) for g in shaper.gens]
        return Response(completion_json(shaper.completion()), media_type="application/json")

    async def render_chat(request: Request) -> Response:
        try:
            body = await json_body(request)
            job = engine.prepare(body)
        except RequestError as exc:
            return _error(exc)
        answer = render.generate_request(engine, job, request.headers.get("x-request-id"))
        renders.remember(answer["request_id"], job.body)  # the conversation of a later token-in request
        return JSONResponse(answer)

    async def generate_tokens(request: Request) -> Response:
        try:
            body = await json_body(request)
            job = engine.prepare(generate.chat_body(body, settings.vllm_release, renders))
        except RequestError as exc:
            return _error(exc)
        if "5xx" in job.faults:
            return _error(RequestError("injected upstream failure (fault: 5xx)", 500, "InternalServerError"))
        request_id = generate.response_id(request.headers.get("x-request-id"), body)
        shaper = generate.DerenderShaper(engine, job, engine.generate_all(job), request_id, int(time.time()),
                                         settings.served_model_name)

        async def flown():
            async with control.flight(request_id) as flight:
                async for piece in stream_chat(shaper, flight, settings):
                    if piece:
                        yield piece

        return StreamingResponse(flown(), media_type="text/event-stream")

    async def models(request: Request) -> Response:
        now = int(time.time())
        name = settings.served_model_name
        permission = {
            "id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission", "created": now,
            "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
            "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
            "organization": "*", "group": None, "is_blocking": False,
        }
        card = {"id": name, "object": "model", "created": now, "owned_by": "vllm", "root": name,
                "parent": None, "max_model_len": settings.max_model_len, "permission": [permission]}
        return JSONResponse({"object": "list", "data": [card]})

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def version(request: Request) -> Response:
        return JSONResponse({"version": VLLM_VERSIONS[settings.vllm_release]})

    async def tokenize(request: Request) -> Response:
        try:
            body = await json_body(request)
            if not isinstance(body, dict):
                raise RequestError("the request body must be a JSON object")
            engine.check_model(body)
            if "messages" in body:
                text = template.render_prompt(
                    body["messages"], body.get("tools"),
                    add_generation_prompt=bool(body.get("add_generation_prompt", True)),
                    drop_reasoning=settings.drop_reasoning_in_history)
                ids = engine.tok.encode(text)
            elif isinstance(body.get("prompt"), str):
                # add_special_tokens adds nothing: this tokenizer has no BOS
                ids = engine.tok.encode(body["prompt"])
            else:
                raise RequestError("give 'prompt' (a string) or 'messages'", param="prompt")
        except template.TemplateError as exc:
            return _error(RequestError(str(exc), param="messages"))
        except RequestError as exc:
            return _error(exc)
        strs = [engine.tok.token_str(t) for t in ids] if body.get("return_token_strs") else None
        return JSONResponse({"count": len(ids), "max_model_len": settings.max_model_len,
                             "tokens": ids, "token_strs": strs})

    async def detokenize(request: Request) -> Response:
        try:
            body = await json_body(request)
            tokens = body.get("tokens") if isinstance(body, dict) else None
            if not isinstance(tokens, list) or not all(engine.tok.is_valid(t) for t in tokens):
                raise RequestError("'tokens' must be a list of token ids", param="tokens")
            engine.check_model(body)
        except RequestError as exc:
            return _error(exc)
        return JSONResponse({"prompt": engine.tok.decode(tokens)})

    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/chat/completions/render", render_chat, methods=["POST"]),
        Route(generate.GENERATE_PATH, generate_tokens, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/version", version, methods=["GET"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
        *admin.routes(engine),
        *(checkpoint.routes(engine) if settings.sleep_mode else ()),
    ]

    async def http_error(request: Request, exc: Exception) -> Response:
        # FastAPI's shape, which is what vLLM answers for unknown routes and methods
        assert isinstance(exc, HTTPException)
        return JSONResponse({"detail": exc.detail}, exc.status_code, headers=exc.headers)

    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error})
    app.state.engine = engine
    app.state.settings = settings
    return app
