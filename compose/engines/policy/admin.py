"""Control routes of the reference policy server: vLLM's RL dev-mode routes and tokentrail's own.

vLLM 0.33 with ``VLLM_SERVER_DEV_MODE=1`` (``vllm/entrypoints/rl/online/api_router.py``;
served here when ``settings.dev_mode``):

* ``POST /pause?mode=abort|wait|keep&clear_cache=bool`` -> ``{"status": "paused"}``
* ``POST /resume`` -> ``{"status": "resumed"}``; ``GET /is_paused`` -> ``{"is_paused": bool}``
* ``POST /abort_requests {"request_ids"?: [...]}`` -> ``{"status": "aborted", "aborted": n}``
* ``POST /update_weight_version {"new_version": str}`` -> ``{"success": true, "new_version": str}``
* ``POST /finish_weight_update {"weight_version"?: str}`` -> ``{"message": "Weight update finished"}``
* ``GET /weight_info`` -> ``{"weight_version": str}``

tokentrail's (always served):

* ``POST /tokentrail/score {"token_ids", "start", "weight_version"?}`` ->
  ``{"logprobs": [logprob(t_i | t_<i) for i in start..n-1], "weight_version": label}``
* ``GET|POST /tokentrail/admin/weight-version`` read / set ``{"version": label or N}``
  -> ``{"weight_version": label}`` (an integer N is the label ``"N"``)

Validation errors have vLLM's FastAPI shape (``validation.validation_error``).
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from compose.engines.policy.control import PAUSE_MODES
from compose.engines.policy.engine import PolicyEngine
from compose.engines.policy.protocol import error_body
from compose.engines.policy.validation import RequestError, coerce, validation_error


def error_response(exc: RequestError) -> JSONResponse:
    return JSONResponse(error_body(exc.message, exc.err_type, exc.status, exc.param), exc.status)


async def embedded_body(request: Request) -> dict:
    """A FastAPI ``Body(embed=True)`` body: read only when it is JSON; anything else counts as absent."""
    kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    raw = await request.body()
    if kind != "application/json" or not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise validation_error("json_invalid", f"body.{getattr(exc, 'pos', 0)}", "JSON decode error", {},
                               {"error": getattr(exc, "msg", str(exc))}) from None
    return data if isinstance(data, dict) else {}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _label(value: Any, param: str) -> str:
    if _is_int(value) and 0 <= value < 2**31:
        return str(value)
    if isinstance(value, str) and 0 < len(value) <= 256:
        return value
    raise RequestError(f"'{param}' must be a weight version label (a string) or a non-negative integer",
                       param=param)


def routes(engine: PolicyEngine) -> list[Route]:
    control = engine.control

    async def pause(request: Request) -> Response:
        mode = request.query_params.get("mode", "abort")
        try:
            if mode not in PAUSE_MODES:
                raise validation_error("literal_error", "query.mode", "Input should be 'abort', 'wait' or 'keep'",
                                       mode, {"expected": "'abort', 'wait' or 'keep'"})
            clear = request.query_params.get("clear_cache")
            if clear is not None:
                try:
                    coerce("clear_cache", clear, bool)
                except RequestError:
                    raise validation_error("bool_parsing", "query.clear_cache",
                                           "Input should be a valid boolean, unable to interpret input", clear) from None
        except RequestError as exc:
            return error_response(exc)
        await control.pause(mode)
        return JSONResponse({"status": "paused"})

    async def resume(request: Request) -> Response:
        control.resume()
        return JSONResponse({"status": "resumed"})

    async def is_paused(request: Request) -> Response:
        return JSONResponse({"is_paused": control.paused})

    async def abort_requests(request: Request) -> Response:
        try:
            body = json.loads(await request.body() or b"null")
        except ValueError:
            return JSONResponse({"error": {"message": "Invalid JSON format", "type": "Bad Request", "param": None,
                                           "code": 400}}, 400)
        if not isinstance(body, dict):
            return JSONResponse({"error": {"message": "Request body must be a JSON object", "type": "Bad Request",
                                           "param": None, "code": 400}}, 400)
        wanted = body.get("request_ids")
        flights = [f for f in list(control.flights) if not wanted or f.request_id in wanted]
        for flight in flights:
            flight.abort()
        return JSONResponse({"status": "aborted", "aborted": len(wanted) if wanted else len(flights)})

    async def update_weight_version(request: Request) -> Response:
        try:
            body = await embedded_body(request)
            if "new_version" not in body:
                raise validation_error("missing", "body.new_version", "Field required", None)
            value = body["new_version"]
            if not isinstance(value, str):
                raise validation_error("string_type", "body.new_version", "Input should be a valid string", value)
        except RequestError as exc:
            return error_response(exc)
        engine.weight_version = value
        return JSONResponse({"success": True, "new_version": value})

    async def finish_weight_update(request: Request) -> Response:
        try:
            value = (await embedded_body(request)).get("weight_version")
            if value is not None and not isinstance(value, str):
                raise validation_error("string_type", "body.weight_version", "Input should be a valid string", value)
        except RequestError as exc:
            return error_response(exc)
        if value is not None:
            engine.weight_version = value
        return JSONResponse({"message": "Weight update finished"})

    async def weight_info(request: Request) -> Response:
        return JSONResponse({"weight_version": engine.weight_version})

    async def score(request: Request) -> Response:
        try:
            body = json.loads(await request.body())
            if not isinstance(body, dict):
                raise RequestError("the request body must be a JSON object")
            ids, start = body.get("token_ids"), body.get("start", 0)
            version = body.get("weight_version")
            if not isinstance(ids, list) or not all(engine.tok.is_valid(t) for t in ids):
                raise RequestError("'token_ids' must be a list of token ids", param="token_ids")
            if not _is_int(start) or not 0 <= start <= len(ids):
                raise RequestError(f"'start' must be an integer in 0..{len(ids)}", param="start")
            used = engine.weight_version if version is None else _label(version, "weight_version")
        except ValueError:
            return error_response(RequestError("the request body is not valid JSON"))
        except RequestError as exc:
            return error_response(exc)
        return JSONResponse({"logprobs": engine.score(ids, start, used), "weight_version": used})

    async def weight_version(request: Request) -> Response:
        if request.method == "POST":
            try:
                body = json.loads(await request.body())
                engine.weight_version = _label(body.get("version") if isinstance(body, dict) else None, "version")
            except ValueError:
                return error_response(RequestError("the request body is not valid JSON"))
            except RequestError as exc:
                return error_response(exc)
        return JSONResponse({"weight_version": engine.weight_version})

    always = [
        Route("/tokentrail/score", score, methods=["POST"]),
        Route("/tokentrail/admin/weight-version", weight_version, methods=["GET", "POST"]),
    ]
    if not engine.settings.dev_mode:
        return always
    return always + [
        Route("/pause", pause, methods=["POST"]),
        Route("/resume", resume, methods=["POST"]),
        Route("/is_paused", is_paused, methods=["GET"]),
        Route("/abort_requests", abort_requests, methods=["POST"]),
        Route("/update_weight_version", update_weight_version, methods=["POST"]),
        Route("/finish_weight_update", finish_weight_update, methods=["POST"]),
        Route("/weight_info", weight_info, methods=["GET"]),
    ]
