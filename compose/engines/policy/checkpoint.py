"""vLLM 0.34's checkpoint routes (served with ``--enable-sleep-mode``; here ``settings.sleep_mode``).

``vllm/entrypoints/serve/checkpoint/api_router.py`` and ``EngineCore.checkpoint_prepare``:

* ``POST /checkpoint/prepare?mode=abort|wait|keep`` (default ``wait``) drains the engine with
  that pause mode, then releases what a process checkpoint must not hold; it returns once
  started: ``{"state": "prepared"}`` when the drain is done, ``{"state": "preparing"}`` while
  ``wait`` still lets generations finish. With ``abort`` every generation in flight ends now
  with finish_reason ``"abort"`` and the tokens generated so far, exactly as
  ``POST /pause?mode=abort`` ends them (``control.py``). Repeating it is a no-op.
* ``POST /checkpoint/restore`` brings the engine back and resumes it: ``{"state": "running"}``;
  400 with ``{"state": "preparing"}`` while a drain is under way.
* ``GET /checkpoint/status``: 200 once prepared (safe to capture), 503 otherwise.

New requests wait while the engine is not running (vLLM queues them) and go on after the
restore. Bodies are ``CheckpointStateResponse.model_dump(exclude_none=True)``. A ``mode``
outside ``PauseMode`` is FastAPI's query validation error, as vLLM renders it.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from compose.engines.policy.admin import error_response
from compose.engines.policy.control import PAUSE_MODES
from compose.engines.policy.engine import PolicyEngine
from compose.engines.policy.validation import validation_error


def routes(engine: PolicyEngine) -> list[Route]:
    control = engine.control
    state = {"state": "running"}
    drains: set[asyncio.Task[None]] = set()

    async def drain(mode: str) -> None:
        await control.pause(mode)
        if state["state"] == "preparing":
            state["state"] = "prepared"

    async def prepare(request: Request) -> Response:
        mode = request.query_params.get("mode", "wait")
        if mode not in PAUSE_MODES:
            return error_response(validation_error(
                "literal_error", "query.mode", "Input should be 'abort', 'wait' or 'keep'", mode,
                {"expected": "'abort', 'wait' or 'keep'"}))
        if state["state"] == "running":
            state["state"] = "preparing"
            task = asyncio.ensure_future(drain(mode))
            drains.add(task)
            task.add_done_callback(drains.discard)
            await asyncio.wait({task}, timeout=0.1)  # "returns once started"; abort and keep are done by now
        return JSONResponse(dict(state))

    async def restore(request: Request) -> Response:
        if state["state"] == "preparing":
            return JSONResponse(dict(state), 400)
        if state["state"] == "prepared":
            control.resume()
            state["state"] = "running"
        return JSONResponse(dict(state))

    async def status(request: Request) -> Response:
        return JSONResponse(dict(state), 200 if state["state"] == "prepared" else 503)

    return [
        Route("/checkpoint/prepare", prepare, methods=["POST"]),
        Route("/checkpoint/restore", restore, methods=["POST"]),
        Route("/checkpoint/status", status, methods=["GET"]),
    ]
