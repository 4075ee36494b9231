"""Identifiers: rollout ids, model call ids, and response ids that name their call.

Rollout ids are caller-chosen and are rejected, never rewritten, when they do not
match ``ROLLOUT_ID_PATTERN``. Model call ids are minted by the interceptor.
Response ids returned to a harness embed the model call id, so the response id
a harness reports as its final answer names the call exactly.
"""

from __future__ import annotations

import re
import uuid

from schemas.errors import ContractError

ROLLOUT_ID_RULE = "^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$"
ROLLOUT_ID_PATTERN = re.compile(ROLLOUT_ID_RULE)
_CALL_ID_PATTERN = re.compile(r"[0-9a-f]{32}")
# One marker for every dialect: chatcmpl-tt<id>, msg_tt<id>, resp_tt<id>.
_RESPONSE_ID_PREFIXES = {"chat": "chatcmpl-tt", "anthropic": "msg_tt", "responses": "resp_tt"}
_RESPONSE_ID_PATTERN = re.compile(r"(?:chatcmpl-|msg_|resp_)tt([0-9a-f]{32})")


def validate_rollout_id(rollout_id: object) -> str:
    """Return the id unchanged, or raise ContractError naming the rule."""
    if not isinstance(rollout_id, str) or not ROLLOUT_ID_PATTERN.fullmatch(rollout_id):
        raise ContractError(
            f"invalid rollout id {rollout_id!r}: a rollout id must match {ROLLOUT_ID_RULE} "
            "(start with a letter or digit; then letters, digits, '.', '_' or '-'; at most 200 characters). "
            "It is rejected, not rewritten: choose an id such as 'step12.task7-r3'."
        )
    return rollout_id


def new_model_call_id() -> str:
    return uuid.uuid4().hex


def new_event_id() -> str:
    return uuid.uuid4().hex


def response_id_for(dialect: str, model_call_id: str) -> str:
    """The response id the harness sees for a call; it embeds the call id."""
    return _RESPONSE_ID_PREFIXES[dialect] + model_call_id


def call_id_from_response_id(response_id: str | None) -> str | None:
    """The model call id a response id declares, or None if it names none."""
    if not response_id:
        return None
    match = _RESPONSE_ID_PATTERN.search(response_id)
    return match.group(1) if match else None


def is_model_call_id(value: str) -> bool:
    return bool(_CALL_ID_PATTERN.fullmatch(value))
