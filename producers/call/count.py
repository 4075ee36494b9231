"""``handle_count``: a dialect's token-counting route, answered from the engine's ``/tokenize`` (records nothing).

Gemini clients count tokens with ``POST .../models/{model}:countTokens``; the engine has no such route.
The dialect's adapter translates the request (``count_request``: the chat body its generating route would
send, so the count is of the prompt the engine would render for that request, template, system prompt and
tools included), the engine renders and counts it (vLLM's ``POST /tokenize`` with ``messages``,
``producers.engine.info.prompt_tokens``), and the adapter answers the count in its own shape
(``count_response``). The registry checks at startup that such an adapter has both
(``producers.dialects.registry.COUNT_METHODS``).

Guarantees: nothing is recorded, announced or captured, on any prefix (route policy ``count``): a count
can never mask a rollout nor create a capture. A request the dialect cannot translate is a 400 naming the
field; an engine that cannot count is a 502 naming the engine's answer; both in the dialect's error shape.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from starlette.responses import Response

from producers.call.dispatch import auth_of
from producers.dialects.common import json_type
from producers.engine.info import EngineCallError, prompt_tokens
from producers.http.json_limits import load_json, nesting_problem

if TYPE_CHECKING:
    from starlette.requests import Request

    from producers.dialects.base import DialectAdapter
    from producers.services import CaptureServices

__all__ = ["handle_count"]

log = logging.getLogger("tokentrail.interceptor")


async def handle_count(svc: CaptureServices, request: Request, api_path: str, adapter: DialectAdapter) -> Response:
    """The token count of the request's prompt, in the adapter's dialect; nothing is recorded."""
    what = f"invalid {adapter.spec.name} token-count request"
    try:
        body = load_json(await request.body(), "the request body")
        if not isinstance(body, dict):
            raise ValueError(f"the request body must be a JSON object, got a JSON {json_type(body)}")
        problem = nesting_problem(body)
        if problem is not None:
            raise ValueError(problem)
        chat: dict[str, Any] = adapter.count_request(body, api_path=api_path)  # type: ignore[attr-defined]
    except ValueError as exc:
        return adapter.error(400, f"{what}: {exc}", "invalid_request_error")
    headers = svc.upstream_headers(request)
    auth = auth_of(headers)
    try:
        engine = await svc.core.catalog.get(svc.upstream, auth)
        forced = svc.settings.upstream_model
        model = engine.choose(chat.get("model"), forced)[0] if engine is not None else forced or chat.get("model")
        if model is not None:
            chat["model"] = model
        count = await prompt_tokens(svc.upstream, auth, chat)
    except EngineCallError as exc:
        log.info("token count on %s failed: %s", api_path, exc)
        return adapter.error(502, f"the engine could not count the prompt's tokens: {exc}", "api_error")
    return adapter.count_response(count)  # type: ignore[attr-defined]
