"""The interceptor's control routes: finishing a rollout and setting the policy version.

Guarantees: every control route needs ``Authorization: Bearer <TOKENTRAIL_CONTROL_TOKEN>``
(constant-time compare; with no token configured, every control call is a 401).
``POST /rollouts/<id>/finish`` answers only after RolloutFinished is durable (503
otherwise) and then drops the rollout from the lineage index (a finished rollout is
not continued); a body the event cannot carry is a 400 naming the field
(``producers.finish``). One record per rollout attempt (``producers.http.finished``):
the same finish again is a 200 with the first's event id and ``"duplicate": true``,
nothing published; a finish with another payload is a 409 naming the fields that
differ, nothing published. ``POST /tokentrail/admin/policy-version`` makes a version current at
once (``producers.capture.version_clock``), for trainers that cannot reach the versions topic; calls whose
engine names no version record it (dispatch, completion, and where a stream saw it change).
"""

from __future__ import annotations

import hmac

import orjson
from starlette.requests import Request
from starlette.responses import Response

from producers.dialects.common import json_type
from producers.finish import finish_request_body
from producers.http.finished import FINISH_FIELD_ATTRS, Prior
from producers.http.replies import error_response, json_response
from producers.http.routing import finish_rollout_id
from producers.services import CaptureServices
from schemas.errors import ContractError, TransportError
from schemas.ids import validate_rollout_id
from schemas.records import RolloutFinished

__all__ = ["POLICY_VERSION_PATH", "handle_control"]

POLICY_VERSION_PATH = "/tokentrail/admin/policy-version"
MAX_POLICY_VERSION_CHARS = 256  # a label (a step, a checkpoint name), never a payload


async def handle_control(svc: CaptureServices, request: Request, path: str,
                         raw_path: bytes | bytearray | None) -> Response:
    """Answer a request on a control path (``producers.http.routing.is_control``)."""
    if not _authorized(svc, request):
        return error_response(401, "control routes need 'Authorization: Bearer <token>' matching "
                                   "TOKENTRAIL_CONTROL_TOKEN", "unauthorized")
    try:
        rollout_id = finish_rollout_id(path, raw_path)
    except ContractError as exc:
        return error_response(400, str(exc), "invalid_rollout_id")
    if rollout_id is not None and request.method == "POST":
        return await _finish(svc, request, rollout_id)
    if path == POLICY_VERSION_PATH and request.method == "POST":
        try:
            version = orjson.loads(await request.body())["version"]
        except (ValueError, KeyError, TypeError):
            return error_response(400, 'body must be {"version": "<policy version>"}', "invalid_request_error")
        # A label, as the engine reports one: a string or an integer (a step), or null to clear it.
        # Anything else was stored as its Python repr (a nested one overflowed the stack on the way).
        if not (version is None or (isinstance(version, (str, int)) and not isinstance(version, bool))) \
                or len(str(version)) > MAX_POLICY_VERSION_CHARS:
            return error_response(400, f"field 'version' must be a string or an integer of at most "
                                       f"{MAX_POLICY_VERSION_CHARS} characters, or null, got {json_type(version)}"
                                       f"{'' if isinstance(version, (dict, list)) else ' ' + repr(version)[:80]}",
                                  "invalid_request_error")
        try:
            svc.core.clock.set_admin(None if version is None else str(version))
        except ContractError as exc:  # "" (the unknown version) or a step out of range
            return error_response(400, f"field 'version': {exc}; send a non-empty label, or null to clear it",
                                  "invalid_request_error")
        return json_response({"policy_version": svc.core.clock.label})
    return error_response(404, f"no control route {request.method} {path!r}", "not_found")


def _authorized(svc: CaptureServices, request: Request) -> bool:
    token = svc.settings.control_token
    if token is None:
        return False
    given = request.headers.get("authorization", "")
    return hmac.compare_digest(given.encode(), f"Bearer {token.get_secret_value()}".encode())


async def _finish(svc: CaptureServices, request: Request, rollout_id: str) -> Response:
    try:
        validate_rollout_id(rollout_id)
        body = finish_request_body(await request.body())
    except (ContractError, ValueError) as exc:
        return error_response(400, str(exc), "invalid_request_error")
    book = svc.finished
    prior = book.begin(rollout_id, body)
    if prior is not None and prior.differs:
        return error_response(409, _conflict_message(rollout_id, prior, body), "rollout_finished")
    if prior is not None and prior.event_id is not None:  # the same finish again: it is durable already
        svc.core.index.forget(rollout_id)
        return json_response({"rollout_id": rollout_id, "event_id": prior.event_id, "duplicate": True})
    try:
        event = await svc.core.write(rollout_id, body)
    except TransportError as exc:
        if prior is None:  # this request's entry; a concurrent same finish in flight keeps its own
            book.failed(rollout_id, body)
        return error_response(503, f"RolloutFinished not durable: {exc}", "capture_unavailable")
    book.acknowledged(rollout_id, body, event.event_id)
    svc.core.index.forget(rollout_id)  # a finished rollout is not continued
    return json_response({"rollout_id": rollout_id, "event_id": event.event_id})


def _conflict_message(rollout_id: str, prior: Prior, body: RolloutFinished) -> str:
    first = f"event {prior.event_id}" if prior.event_id else "a finish still being published"
    fields = ", ".join(f"'{name}'" for name in prior.differs)
    values = "; ".join(f"{name} = {_shown(getattr(body, attr))}" for name, attr in FINISH_FIELD_ATTRS
                       if name in prior.differs)
    return (f"rollout {rollout_id!r} was already finished through this interceptor ({first}) with another payload: "
            f"field(s) {fields} differ (this finish: {values}). One record per rollout attempt: the first finish "
            "decides the result and its record stands; this finish was not published. A new result is a new "
            "attempt: run it under a new rollout id")


def _shown(value: object) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= 120 else text[:117] + "..."
