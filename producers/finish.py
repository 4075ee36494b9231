"""Finishing a rollout: publish RolloutFinished (the freeze request) with the result and terminal evidence.

Three ways, one event: ``finish_rollout(...)`` (Python), ``tokentrail finish``
(CLI) and ``POST /rollouts/<id>/finish`` on the interceptor (bearer token).
Each returns only after Kafka acknowledged the event.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from producers.capture import default_source, make_event
from producers.http import error_response, json_response
from producers.publisher import KafkaPublisher, producer_config
from schemas.errors import ContractError, TransportError
from schemas.ids import validate_rollout_id
from schemas.records import RolloutFinished
from schemas.topics import ROLLOUT_EVENTS

if TYPE_CHECKING:
    from producers.app import Interceptor


def finished_event_body(
    result: Any = None, *, final_response_id: str | None = None, final_text: str | None = None, attempt: int = 0
) -> RolloutFinished:
    try:
        result_json = json.dumps({} if result is None else result, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ContractError(f"rollout result must be JSON-serialisable (no NaN/inf): {exc}") from exc
    return RolloutFinished(
        attempt=attempt, result_json=result_json, final_response_id=final_response_id, final_text=final_text
    )


async def finish_rollout(
    bootstrap: str,
    rollout_id: str,
    result: Any = None,
    *,
    final_response_id: str | None = None,
    final_text: str | None = None,
    attempt: int = 0,
    topic: str = ROLLOUT_EVENTS,
    publisher: KafkaPublisher | None = None,
) -> str:
    """Publish RolloutFinished; return its event id once acknowledged."""
    validate_rollout_id(rollout_id)
    body = finished_event_body(result, final_response_id=final_response_id, final_text=final_text, attempt=attempt)
    event = make_event(rollout_id, body, f"finish:{default_source()}")
    own = publisher is None
    pub = publisher or KafkaPublisher(producer_config(bootstrap))
    try:
        await pub.publish(topic, event)
    finally:
        if own:
            await pub.close()
    return event.event_id


async def handle_finish(app: Interceptor, request: Request, rollout_id: str) -> Response:
    try:
        validate_rollout_id(rollout_id)
        payload = orjson.loads(await request.body() or b"{}")
        if not isinstance(payload, dict):
            raise ContractError("body must be a JSON object: {result, final_response_id, final_text, attempt}")
        unknown = set(payload) - {"result", "final_response_id", "final_text", "attempt"}
        if unknown:
            raise ContractError(f"unknown field(s) {sorted(unknown)}; allowed: result, final_response_id, final_text, attempt")
        body = finished_event_body(
            payload.get("result"),
            final_response_id=payload.get("final_response_id"),
            final_text=payload.get("final_text"),
            attempt=int(payload.get("attempt") or 0),
        )
    except (ContractError, ValueError) as exc:
        return error_response(400, str(exc), "invalid_request_error")
    event = make_event(rollout_id, body, app.source)
    try:
        await app.publish_event(event)
    except TransportError as exc:
        return error_response(503, f"RolloutFinished not durable: {exc}", "capture_unavailable")
    app.core.index.forget(rollout_id)  # a finished rollout is not continued
    return json_response({"rollout_id": rollout_id, "event_id": event.event_id})
