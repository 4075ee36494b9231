"""Capture of one OpenAI chat-completions call (non-streaming).

Order of a call: parse → ask the engine for token ids and log-probs → extract
→ publish the evidence and await the broker's ack → answer the harness without
any token field. Durable evidence always precedes a successful answer:

- engine unreachable or failing: CallIncomplete(upstream_error), the error goes back;
- engine answered without token ids (or with partial ones): CallIncomplete, and
  the model's answer still goes back once the marker is durable;
- evidence cannot be made durable: 503, never a success.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import httpx
import orjson
from starlette.requests import Request
from starlette.responses import Response

from producers.capture import CallContext, call_facts, captured_call, request_items
from producers.http import error_response, json_response
from producers.extract import PartialTokenMetadata, chat_output_items, extract_chat_tokens, strip_chat_response
from schemas.errors import TransportError
from schemas.ids import response_id_for
from schemas.records import Dialect, IncompleteReason

if TYPE_CHECKING:
    from producers.app import Interceptor

log = logging.getLogger("tokentrail.interceptor")


async def handle_chat(app: Interceptor, request: Request, rollout_id: str, api_path: str) -> Response:
    try:
        body = orjson.loads(await request.body())
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            raise ValueError("body must be a JSON object with a 'messages' list")
    except ValueError as exc:
        return error_response(400, f"invalid chat completions request: {exc}", "invalid_request_error")
    if body.get("n") not in (None, 1):
        return error_response(400, f"n={body.get('n')!r}: token capture needs exactly one choice per call (n=1)",
                              "invalid_request_error")
    if body.get("stream"):
        return await app.forward_uncaptured(request, rollout_id, api_path, "streaming chat completions")

    upstream_body = app.upstream_body(body)
    headers = {k.lower(): v for k, v in request.headers.items()}
    system = [m.get("content") for m in body["messages"] if isinstance(m, dict) and m.get("role") in ("system", "developer")]
    ctx = CallContext(
        rollout_id=rollout_id,
        route=api_path,
        dialect=Dialect.CHAT_COMPLETIONS,
        items=request_items(body["messages"], tools=body.get("tools")),
        facts=call_facts(route=api_path, dialect=Dialect.CHAT_COMPLETIONS, body=body, upstream_body=upstream_body,
                         headers=headers, system=system, tools=body.get("tools"), streamed=False),
    )
    try:
        upstream = await app.upstream.post(api_path, content=orjson.dumps(upstream_body),
                                           headers=app.upstream_headers(request))
    except httpx.HTTPError as exc:
        await app.record_incomplete(ctx, IncompleteReason.UPSTREAM_ERROR, api_path, None, repr(exc), required=False)
        return error_response(502, f"model server unreachable: {exc!r}", "upstream_error")
    if upstream.status_code >= 400:
        await app.record_incomplete(ctx, IncompleteReason.UPSTREAM_ERROR, api_path, upstream.status_code,
                                    upstream.text[:500], required=False)
        return Response(upstream.content, status_code=upstream.status_code,
                        media_type=upstream.headers.get("content-type", "application/json"))
    try:
        data = orjson.loads(upstream.content)
        tokens = extract_chat_tokens(data)
    except (ValueError, PartialTokenMetadata) as exc:
        reason = IncompleteReason.PARTIAL_TOKEN_METADATA if isinstance(exc, PartialTokenMetadata) else IncompleteReason.UPSTREAM_ERROR
        if not await app.record_incomplete(ctx, reason, api_path, upstream.status_code, str(exc), required=True):
            return app.durability_error()
        if reason is IncompleteReason.UPSTREAM_ERROR:
            return error_response(502, f"model server answered with invalid JSON: {exc}", "upstream_error")
        return _answer(data, body, ctx)

    if tokens is None:
        if not await app.record_incomplete(ctx, IncompleteReason.MISSING_TOKEN_IDS, api_path, upstream.status_code,
                                           "engine returned no token ids (is it vLLM with return_token_ids?)",
                                           required=True):
            return app.durability_error()
        return _answer(data, body, ctx)

    message = data["choices"][0].get("message") or {}
    items, carrier = chat_output_items(message)
    version, version_source = app.policy_version_of(data)
    call = captured_call(
        ctx, tokens, items, carrier,
        served_model=str(data.get("model") or ""),
        response_id=response_id_for("chat", ctx.model_call_id),
        policy_version=version,
        policy_version_source=version_source,
    )
    try:
        await app.publish(rollout_id, call)
    except TransportError as exc:
        log.error("capture of call %s (rollout %s) not durable: %s", ctx.model_call_id, rollout_id, exc)
        return app.durability_error()
    app.metrics.captured.inc()
    return _answer(data, body, ctx)


def _answer(data: dict[str, Any], body: dict[str, Any], ctx: CallContext) -> Response:
    clean = strip_chat_response(data, keep_logprobs=bool(body.get("logprobs")))
    clean["id"] = response_id_for("chat", ctx.model_call_id)
    return json_response(clean)
