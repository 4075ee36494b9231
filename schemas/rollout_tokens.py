"""Rollout tokens: the API key a harness presents for one rollout (pure; stdlib only).

With a rollout secret configured (``TOKENTRAIL_ROLLOUT_SECRET``), the interceptor serves a
request under ``/ng-rollout/<id>/`` only when it carries ``rollout_token(secret, id)`` as its
API key (``Authorization: Bearer <token>`` or ``x-api-key: <token>``: how Claude Code, Codex
and the OpenAI/Anthropic SDKs send a key, so a harness carries it unmodified). A harness that
knows its own token cannot derive another rollout's, so it can neither inject calls into nor
mask another rollout.

Guarantees:

* ``rollout_token`` is a pure function of (secret, rollout id): ``"ttr-"`` + the lowercase hex
  HMAC-SHA256 of the UTF-8 rollout id keyed with the secret's bytes. It is computed in
  different processes (the trainer that launches a harness, the interceptor, the CLI), so its
  value is pinned by a golden vector test and must never change.
* ``token_matches`` compares in constant time (``hmac.compare_digest``) and is False for
  anything that is not a str, never an exception.
* A secret shorter than ``MIN_SECRET_BYTES`` is refused (``ConfigError``): a short secret
  can be guessed offline from one token.
"""

from __future__ import annotations

import hashlib
import hmac

from schemas.errors import ConfigError
from schemas.ids import validate_rollout_id

__all__ = ["MIN_SECRET_BYTES", "TOKEN_PREFIX", "check_secret", "rollout_token", "token_matches"]

TOKEN_PREFIX = "ttr-"
MIN_SECRET_BYTES = 16


def check_secret(secret: bytes | str) -> bytes:
    """The secret as bytes (UTF-8 for a str); ConfigError when it is too short to be safe."""
    raw = secret.encode() if isinstance(secret, str) else bytes(secret)
    if len(raw) < MIN_SECRET_BYTES:
        raise ConfigError(f"the rollout secret has {len(raw)} bytes; it needs at least {MIN_SECRET_BYTES} "
                          "(e.g. `openssl rand -hex 32`)")
    return raw


def rollout_token(secret: bytes | str, rollout_id: str) -> str:
    """The API key of ``rollout_id`` under ``secret`` (ContractError for an invalid rollout id)."""
    validate_rollout_id(rollout_id)
    digest = hmac.new(check_secret(secret), rollout_id.encode(), hashlib.sha256).hexdigest()
    return TOKEN_PREFIX + digest


def token_matches(secret: bytes | str, rollout_id: str, presented: object) -> bool:
    """Whether ``presented`` is ``rollout_id``'s token (constant-time; False for a non-str)."""
    if not isinstance(presented, str):
        return False
    expected = rollout_token(secret, rollout_id)
    # compare_digest on bytes: a non-ASCII str would raise TypeError as a str.
    return hmac.compare_digest(expected.encode(), presented.encode("utf-8", errors="replace"))
