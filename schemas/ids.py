"""Identifiers: rollout ids, model call ids, and response ids that name their call.

Rollout ids are caller-chosen and are rejected, never rewritten, when they do not
match ``ROLLOUT_ID_PATTERN``. Model call ids are minted by the interceptor
(``uuid4().hex``), but NeMo Gym's transport adapters and direct producers bring
their own (Gym's conformance kit uses ``call-1``, ``call-lost``): the processor
accepts any id matching ``CALL_ID_RULE`` and refuses (dead-letters) the rest,
because a call id becomes part of state keys and of the snapshot.
Response ids returned to a harness embed the model call id, so the response id
a harness reports as its final answer names the call exactly.

A response id is ``<prefix>tt<model call id>``. The prefixes belong to the dialects
(``producers.dialects.registry``: ``chatcmpl-``, ``msg_``, ``resp_``, ...) and are not
listed here: any prefix matching ``RESPONSE_ID_PREFIX_RULE`` (letters and digits, ending
in ``-`` or ``_``) is read back by ``call_id_from_response_id``, so a new dialect needs no
edit here and readers of old ids keep working.
"""

from __future__ import annotations

import re
import uuid

from schemas.errors import ContractError

ROLLOUT_ID_RULE = "^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$"
ROLLOUT_ID_PATTERN = re.compile(ROLLOUT_ID_RULE)
# A model call id: the rollout-id alphabet and bound (letters, digits, '.', '_', '-'; at most 200).
# It holds every id our producers mint (32 lowercase hex) and Gym's (uuid4().hex; the conformance
# kit's "call-1"), and keeps out what state keys (processors.state: NUL-separated) and logs cannot
# hold: the empty id, NUL and other control characters, '/', whitespace, unbounded lengths.
CALL_ID_RULE = "^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$"
CALL_ID_PATTERN = re.compile(CALL_ID_RULE)
# A dialect's response-id prefix: what the dialect's SDKs expect ids to start with.
RESPONSE_ID_PREFIX_RULE = "^[A-Za-z][A-Za-z0-9_-]*[-_]$"
_RESPONSE_ID_PREFIX_PATTERN = re.compile(RESPONSE_ID_PREFIX_RULE)
# One marker for every dialect (chatcmpl-tt<id>, msg_tt<id>, resp_tt<id>): it tells an id we
# minted from the engine's or a harness's own ids.
RESPONSE_ID_MARKER = "tt"
# ``<prefix>tt<32 hex>`` anywhere in a string. The match is tried from the first letter of each run
# of id characters only (the lookbehind): a later letter of the same run can only reach matches that
# the first one reaches, and trying every letter made the search quadratic in the length of a
# harness-supplied final_response_id (a 1 MB one stalled the rebuild for hours). Same matches, linear.
_RESPONSE_ID_PATTERN = re.compile(r"(?<![A-Za-z0-9_-])[0-9_-]*[A-Za-z][A-Za-z0-9_-]*?[-_]tt([0-9a-f]{32})")


def validate_rollout_id(rollout_id: object) -> str:
    """Return the id unchanged, or raise ContractError naming the rule."""
    return _checked(rollout_id, ROLLOUT_ID_PATTERN, "rollout id", f"a rollout id must match {ROLLOUT_ID_RULE}",
                    "It is rejected, not rewritten: choose an id such as 'step12.task7-r3'.")


def validate_model_call_id(call_id: object, *, field: str = "model_call_id") -> str:
    """Return the id unchanged, or raise ContractError naming ``field``, the value and the rule."""
    return _checked(call_id, CALL_ID_PATTERN, field, f"a model call id must match {CALL_ID_RULE}",
                    "It is refused, not rewritten: mint ids with schemas.ids.new_model_call_id() (uuid4().hex)")


def _checked(value: object, pattern: re.Pattern[str], what: str, rule: str, fix: str) -> str:
    """``value`` when ``pattern`` matches all of it; else ContractError naming ``what``, the value, the rule, the fix."""
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise ContractError(f"invalid {what} {_shown(value)}: {rule} (start with a letter or digit; then letters, "
                            f"digits, '.', '_' or '-'; at most 200 characters). {fix}")
    return value


def _shown(value: object) -> str:
    """The value for an error message: its repr, cut to a prefix and the length when it is long."""
    if isinstance(value, str) and len(value) > 80:
        return f"{value[:80]!r}... ({len(value)} characters)"
    return repr(value)


def new_model_call_id() -> str:
    return uuid.uuid4().hex


def new_event_id() -> str:
    return uuid.uuid4().hex


def check_response_id_prefix(prefix: object) -> str:
    """Return the prefix unchanged, or raise ContractError naming the rule."""
    if not isinstance(prefix, str) or not _RESPONSE_ID_PREFIX_PATTERN.fullmatch(prefix):
        raise ContractError(f"invalid response-id prefix {prefix!r}: it must match {RESPONSE_ID_PREFIX_RULE} "
                            "(such as 'chatcmpl-' or 'msg_') so that call_id_from_response_id reads it back")
    return prefix


def response_id(prefix: str, model_call_id: str) -> str:
    """The response id the harness sees for a call: ``prefix`` (its dialect's) + ``tt`` + the call id."""
    return check_response_id_prefix(prefix) + RESPONSE_ID_MARKER + model_call_id


def call_id_from_response_id(response_id: str | None) -> str | None:
    """The model call id a response id declares (``<prefix>tt<32 hex>`` anywhere in it), or None."""
    if not response_id:
        return None
    match = _RESPONSE_ID_PATTERN.search(response_id)
    return match.group(1) if match else None


