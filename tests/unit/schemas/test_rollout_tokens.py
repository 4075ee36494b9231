"""Rollout tokens are computed in several processes (trainer, interceptor, CLI): pinned by golden vectors."""

from __future__ import annotations

import pytest

from schemas.errors import ConfigError, ContractError
from schemas.rollout_tokens import MIN_SECRET_BYTES, rollout_token, token_matches

SECRET = "tokentrail-golden-secret-0001"


@pytest.mark.parametrize(("rollout_id", "token"), [
    # printf '%s' <rollout id> | openssl dgst -sha256 -hmac tokentrail-golden-secret-0001
    ("step12.task7-r3", "ttr-c5e29794b5843edad841cfda04d04c85df460f4a8808a8087acc8a47d829b9d0"),
    ("r-1", "ttr-71a5489372d359651ec776e190be8eb0dedbf7f385dc981470ba8fd91dbe5fed"),
])
def test_the_token_is_hmac_sha256_of_the_rollout_id_and_never_changes(rollout_id, token):
    assert rollout_token(SECRET, rollout_id) == token
    assert rollout_token(SECRET.encode(), rollout_id) == token  # str secrets are their UTF-8 bytes


def test_a_token_opens_its_own_rollout_only():
    token = rollout_token(SECRET, "r-1")
    assert token_matches(SECRET, "r-1", token)
    assert not token_matches(SECRET, "r-2", token)
    assert not token_matches(SECRET + "x", "r-1", token)
    for bad in (None, b"bytes", "", token.upper(), token + " ", "café"):
        assert not token_matches(SECRET, "r-1", bad)


def test_a_short_secret_and_an_invalid_rollout_id_are_refused():
    with pytest.raises(ConfigError, match=f"at least {MIN_SECRET_BYTES}"):
        rollout_token("short", "r-1")
    with pytest.raises(ContractError, match="must match"):
        rollout_token(SECRET, "a/b")
