"""The reference policy server: a Starlette app that answers like vLLM 0.33.

Routes:

* ``POST /v1/chat/completions``   non-streaming and SSE (``stream: true``)
* ``GET  /v1/models``, ``GET /health``, ``GET /version``
* ``POST /tokenize``, ``POST /detokenize``               (vLLM shapes)
* ``POST /tokentrail/score``   ``{"token_ids", "start", "weight_version"?}`` ->
  ``{"logprobs": [logprob(t_i | t_<i) for i in start..n-1], "weight_version"}``
* ``GET|POST /tokentrail/admin/weight-version``   read / set ``{"version": N}``

Faults (server-wide via ``PolicySettings.faults``, or per request with a marker
``[[fault:NAME]]`` in the last message's content): ``5xx`` answers HTTP 500 with a vLLM
error body; ``no_token_ids`` omits token ids even when asked; ``stall`` makes a stream
send the first chunk plus ``stall_after_chunks`` chunks, then hang until the client
disconnects (or, with ``stall_seconds``, abort the connection after that long);
``drift`` makes the sampler emit one non-canonical split so re-tokenizing the echoed
text differs. ``drop_reasoning_in_history`` is a template drift (see ``template.py``).

Guarantees: every error is a vLLM-style body ``{"error": {message, type, param, code}}``;
streamed ``token_ids`` concatenate to the non-streaming ``token_ids`` of the same request,
and streamed log-probs equal the non-streaming ones (one generation feeds both shapes).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from compose.policy import template
from compose.policy.agent import Generation
from compose.policy.engine import ChatJob, PolicyEngine, RequestError
from compose.policy.parsing import OutputParser
from compose.policy.protocol import ResponseShaper, error_body
from compose.policy.settings import PolicySettings

VLLM_VERSION = "0.33.0"


class StalledStreamAborted(RuntimeError):
    """Raised inside a stalled stream after ``stall_seconds``: the connection is aborted."""


def _error(exc: RequestError) -> JSONResponse:
    return JSONResponse(error_body(exc.message, exc.err_type, exc.status, exc.param), exc.status)


async def _json_body(request: Request) -> Any:
    try:
        return json.loads(await request.body())
    except ValueError as exc:
        raise RequestError(f"the request body is not valid JSON: {exc}") from None


async def _stream(shaper: ResponseShaper, settings: PolicySettings) -> AsyncIterator[str]:
    job, gen = shaper.job, shaper.gen
    yield shaper.first_chunk()
    stall = "stall" in job.faults
    parser = OutputParser(shaper.tok, tools_enabled=job.tools_enabled)
    # stop strings: vLLM truncates the streamed text exactly like the full message
    budget = len(shaper.parsed().content or "") if isinstance(gen.stop_reason, str) else None
    sent_content, tools_streamed, sent = 0, False, 0
    n = len(gen.token_ids)
    ids_out = shaper.send_ids and not shaper.suppress
    for i, token in enumerate(gen.token_ids):
        delta = parser.feed(token)
        if delta is not None and not job.include_reasoning:
            delta.pop("reasoning", None)
            delta = delta or None
        if delta is not None and budget is not None and isinstance(delta.get("content"), str):
            text = delta["content"][: max(budget - sent_content, 0)]
            sent_content += len(text)
            delta = {"content": text} if text else None
        if delta is not None and delta.get("tool_calls"):
            tools_streamed = True
        finish = shaper.stream_finish_reason(tools_streamed) if i == n - 1 else None
        if delta is None:
            # vLLM still sends a chunk so every id (and log-prob) is delivered
            if finish is None and not shaper.send_logprobs and not ids_out:
                continue
            delta = {}
        if settings.decode_ms_per_token:
            await asyncio.sleep(settings.decode_ms_per_token / 1000)
        yield shaper.token_chunk(i, i + 1, delta, finish)
        sent += 1
        if stall and sent >= settings.stall_after_chunks:
            if settings.stall_seconds is None:
                await asyncio.Event().wait()  # hang until the client goes away
            await asyncio.sleep(settings.stall_seconds)
            raise StalledStreamAborted("stalled stream aborted (fault: stall)")
    if job.include_usage:
        yield shaper.usage_chunk()
    yield "data: [DONE]\n\n"


def create_app(settings: PolicySettings | None = None) -> Starlette:
    """The ASGI app; usable in-process with ``httpx.ASGITransport`` or under uvicorn."""
    settings = settings or PolicySettings()
    engine = PolicyEngine(settings)

    async def chat_completions(request: Request) -> Response:
        try:
            body = await _json_body(request)
            job: ChatJob = engine.prepare(body)
        except RequestError as exc:
            return _error(exc)
        if "5xx" in job.faults:
            return _error(RequestError("injected upstream failure (fault: 5xx)", 500,
                                       "InternalServerError"))
        gen: Generation = engine.generate(job)
        shaper = ResponseShaper(engine, job, gen, f"chatcmpl-{uuid.uuid4().hex}",
                                int(time.time()), settings.served_model_name)
        if job.stream:
            return StreamingResponse(_stream(shaper, settings), media_type="text/event-stream")
        if settings.decode_ms_per_token:
            await asyncio.sleep(settings.decode_ms_per_token * len(gen.token_ids) / 1000)
        return JSONResponse(shaper.completion())

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
        return JSONResponse({"version": VLLM_VERSION})

    async def tokenize(request: Request) -> Response:
        try:
            body = await _json_body(request)
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
            body = await _json_body(request)
            tokens = body.get("tokens") if isinstance(body, dict) else None
            if not isinstance(tokens, list) or not all(engine.tok.is_valid(t) for t in tokens):
                raise RequestError("'tokens' must be a list of token ids", param="tokens")
            engine.check_model(body)
        except RequestError as exc:
            return _error(exc)
        return JSONResponse({"prompt": engine.tok.decode(tokens)})

    async def score(request: Request) -> Response:
        try:
            body = await _json_body(request)
            if not isinstance(body, dict):
                raise RequestError("the request body must be a JSON object")
            ids, start = body.get("token_ids"), body.get("start", 0)
            version = body.get("weight_version")
            if not isinstance(ids, list) or not all(engine.tok.is_valid(t) for t in ids):
                raise RequestError("'token_ids' must be a list of token ids", param="token_ids")
            if not _is_int(start) or not 0 <= start <= len(ids):
                raise RequestError(f"'start' must be an integer in 0..{len(ids)}", param="start")
            if version is not None and not (_is_int(version) and 0 <= version < 2**31):
                raise RequestError("'weight_version' must be a non-negative integer", param="weight_version")
        except RequestError as exc:
            return _error(exc)
        used = engine.weight_version if version is None else version
        return JSONResponse({"logprobs": engine.score(ids, start, used), "weight_version": used})

    async def weight_version(request: Request) -> Response:
        if request.method == "POST":
            try:
                body = await _json_body(request)
                value = body.get("version") if isinstance(body, dict) else None
                if not (_is_int(value) and 0 <= value < 2**31):
                    raise RequestError("'version' must be a non-negative integer", param="version")
            except RequestError as exc:
                return _error(exc)
            engine.weight_version = value
        return JSONResponse({"weight_version": engine.weight_version})

    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/version", version, methods=["GET"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
        Route("/tokentrail/score", score, methods=["POST"]),
        Route("/tokentrail/admin/weight-version", weight_version, methods=["GET", "POST"]),
    ]
    async def http_error(request: Request, exc: Exception) -> Response:
        # FastAPI's shape, which is what vLLM answers for unknown routes and methods
        assert isinstance(exc, HTTPException)
        return JSONResponse({"detail": exc.detail}, exc.status_code, headers=exc.headers)

    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error})
    app.state.engine = engine
    app.state.settings = settings
    return app


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
