"""Finishing a rollout: publish RolloutFinished (the freeze request) with the result and terminal evidence.

Three ways, one event: ``finish_rollout(...)`` (Python), ``tokentrail finish``
(CLI) and ``POST /rollouts/<id>/finish`` on the interceptor (bearer token,
``producers.http.control``). Each returns only after Kafka acknowledged the event.
This module imports no HTTP framework: a trainer calling ``finish_rollout`` pulls
in the Kafka client, not starlette (``test_finish_validation`` proves it).

Every field is checked where it comes in, against what ``RolloutFinished.avsc`` can
hold (``schemas.avro_fields``) and what it means: ``attempt`` is an integer in
[0, 2**31 - 1] (an Avro int; a retry count is never negative), ``final_response_id``
and ``final_text`` are strings or null, ``result`` is JSON with finite numbers, nested
at most ``MAX_JSON_DEPTH`` levels. A value that does not fit is refused (HTTP 400,
``ContractError``) naming the field: an event the processor would dead-letter must
never be acknowledged as a finish.
"""

from __future__ import annotations

import json
from typing import Any

from producers.capture.events import default_source, make_event
from producers.dialects.common import json_type
from producers.http.json_limits import load_json, nesting_problem
from schemas.avro_fields import INT_MAX, check_fields
from schemas.codec import encode_event
from schemas.errors import ContractError
from schemas.ids import validate_rollout_id
from schemas.kafka.bridge import AckedProducer
from schemas.kafka.config import producer_config
from schemas.kafka.security import KafkaSecurity
from schemas.kafka.topics import ROLLOUT_EVENTS, key_for
from schemas.records import RolloutFinished

__all__ = ["FINISH_FIELDS", "finish_request_body", "finish_rollout", "finished_event_body"]

FINISH_FIELDS = ("result", "final_response_id", "final_text", "attempt")


def finished_event_body(
    result: Any = None, *, final_response_id: str | None = None, final_text: str | None = None, attempt: int = 0
) -> RolloutFinished:
    """The RolloutFinished body; ContractError naming the field for a value the event cannot carry."""
    if isinstance(attempt, bool) or not isinstance(attempt, int) or not 0 <= attempt <= INT_MAX:
        raise ContractError(f"field 'attempt' = {attempt!r} ({type(attempt).__name__}) is invalid: attempt is the "
                            f"rollout's retry number, an integer in [0, {INT_MAX}] (RolloutFinished.attempt is an "
                            "Avro int); send e.g. 0 for the first attempt")
    check_fields("RolloutFinished", {"final_response_id": final_response_id, "final_text": final_text})
    problem = nesting_problem(result, "result")
    if problem is not None:
        raise ContractError(problem)
    try:
        result_json = json.dumps({} if result is None else result, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ContractError(f"field 'result' must be JSON-serialisable with finite numbers (no NaN/inf): {exc}; "
                            "send a JSON value such as {\"reward\": 1.0}") from exc
    check_fields("RolloutFinished", {"attempt": attempt, "result_json": result_json})
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
    publisher: AckedProducer | None = None,
    security: KafkaSecurity | None = None,
) -> str:
    """Publish RolloutFinished; return its event id once acknowledged."""
    validate_rollout_id(rollout_id)
    body = finished_event_body(result, final_response_id=final_response_id, final_text=final_text, attempt=attempt)
    event = make_event(rollout_id, body, f"finish:{default_source()}")
    own = publisher is None
    pub = publisher or AckedProducer(producer_config(bootstrap, security=security), name="tokentrail-finish")
    try:
        await pub.produce(topic, key_for(rollout_id), encode_event(event))
    finally:
        if own:
            await pub.close()
    return event.event_id


def finish_request_body(raw: bytes) -> RolloutFinished:
    """The RolloutFinished of a finish route's request body (empty: no result); ContractError or ValueError naming
    what is wrong."""
    payload = load_json(raw, "the finish body") if raw.strip() else {}
    if not isinstance(payload, dict):
        raise ContractError("the finish body must be a JSON object: {result, final_response_id, final_text, "
                            f"attempt}}, got a JSON {json_type(payload)}")
    unknown = set(payload) - set(FINISH_FIELDS)
    if unknown:
        raise ContractError(f"unknown field(s) {sorted(unknown)}; allowed: {', '.join(FINISH_FIELDS)}")
    attempt = payload.get("attempt")
    return finished_event_body(
        payload.get("result"),
        final_response_id=payload.get("final_response_id"),
        final_text=payload.get("final_text"),
        attempt=0 if attempt is None else attempt,  # null is "not given"; nothing else is coerced
    )
