"""SASL OAUTHBEARER for the Faust processor: an OIDC client-credentials token provider for aiokafka.

The confluent-kafka processes fetch their OAUTHBEARER tokens inside librdkafka
(``sasl.oauthbearer.method=oidc``); aiokafka, under Faust, asks a token provider instead
(``aiokafka.abc.AbstractTokenProvider``, handed to it by ``faust.OAuthCredentials``). This is that
provider, reading the same settings of the client config file (``schemas.kafka.security``), so one
file serves every process.

Guarantees:

- A token is fetched with the client-credentials grant: ``POST`` to ``sasl.oauthbearer.token.endpoint.url``,
  form ``grant_type=client_credentials`` (and ``scope`` when the file sets one), the client id and
  secret as HTTP Basic credentials, as librdkafka sends them, so an identity provider set up for
  the other processes answers this one the same way.
- It is cached and shared: concurrent connections wait for one fetch; it is fetched again only when
  its lifetime (``expires_in``) is nearly over (`REFRESH_MARGIN`), so a broker never sees an expired
  token from a connection made in time.
- A failure is a `TransportError` naming the token URL and the HTTP status (and the identity
  provider's own ``error``/``error_description``), never a bare httpx exception.
- The client secret and the tokens are never logged, never in an error and never in the repr.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import httpx
from aiokafka.abc import AbstractTokenProvider

from schemas.errors import TransportError
from schemas.kafka.security import KafkaConfigError, KafkaSecurity, Secret

__all__ = ["OidcTokenProvider", "REFRESH_MARGIN", "DEFAULT_LIFETIME_S"]

log = logging.getLogger("tokentrail.processor.oauth")

# Fetch again when this share of the token's lifetime is left (at most MAX_MARGIN_S): a connection
# made just before the refresh still presents a token with time to spare.
REFRESH_MARGIN = 0.2
MAX_MARGIN_S = 60.0
# A token response without expires_in (OIDC only recommends it): assumed to live this long.
DEFAULT_LIFETIME_S = 300.0


class OidcTokenProvider(AbstractTokenProvider):  # type: ignore[misc]  # aiokafka ships no types
    """OAUTHBEARER tokens from an OIDC token endpoint (client credentials), cached until shortly before expiry."""

    def __init__(self, token_url: str, client_id: str, client_secret: Secret, scope: str | None = None, *,
                 timeout_s: float = 10.0, transport: httpx.AsyncBaseTransport | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``transport`` replaces the network (tests: ``httpx.MockTransport``); ``clock`` the monotonic clock."""
        self.token_url, self.client_id, self.scope = token_url, client_id, scope
        self._secret = client_secret
        self._timeout_s, self._transport, self._clock = timeout_s, transport, clock
        self._token: str | None = None
        self._refresh_at = 0.0
        self._lock = asyncio.Lock()  # one fetch at a time: concurrent connections share its token

    @classmethod
    def of(cls, security: KafkaSecurity, **kw: Any) -> OidcTokenProvider:
        """The provider of an OAUTHBEARER `KafkaSecurity`; `KafkaConfigError` for any other mechanism."""
        if (security.mechanism != "OAUTHBEARER" or security.oauth_token_url is None
                or security.oauth_client_id is None or security.oauth_client_secret is None):
            raise KafkaConfigError(f"{security.source or 'the Kafka client config'}: an OIDC token provider needs "
                                   "sasl.mechanism=OAUTHBEARER with sasl.oauthbearer.token.endpoint.url, .client.id "
                                   f"and .client.secret (got {security.describe()})")
        return cls(security.oauth_token_url, security.oauth_client_id, security.oauth_client_secret,
                   security.oauth_scope, **kw)

    async def token(self) -> str:
        """A valid access token: the cached one, or a fresh one once the cached one is due (`REFRESH_MARGIN`)."""
        async with self._lock:
            if self._token is None or self._clock() >= self._refresh_at:
                token, lifetime_s = await self._fetch()
                margin = min(lifetime_s * REFRESH_MARGIN, MAX_MARGIN_S)
                self._token, self._refresh_at = token, self._clock() + lifetime_s - margin
                log.info("OAUTHBEARER token for client %s from %s, valid %.0f s", self.client_id, self.token_url,
                         lifetime_s)
            return self._token

    def __repr__(self) -> str:
        return f"OidcTokenProvider(token_url={self.token_url!r}, client_id={self.client_id!r})"

    # -- the request --------------------------------------------------------------------------------
    async def _fetch(self) -> tuple[str, float]:
        form = {"grant_type": "client_credentials", **({"scope": self.scope} if self.scope else {})}
        where = f"the OAUTHBEARER token URL {self.token_url} (sasl.oauthbearer.token.endpoint.url)"
        try:
            async with httpx.AsyncClient(transport=self._transport, timeout=self._timeout_s) as client:
                response = await client.post(self.token_url, data=form,
                                             auth=httpx.BasicAuth(self.client_id, self._secret.reveal()),
                                             headers={"accept": "application/json"})
        except httpx.HTTPError as exc:  # its text is the URL and the cause; the credentials are in a header
            raise TransportError(self._scrub(f"{where}: no answer ({type(exc).__name__}: {exc}); check the URL "
                                             "and that this host reaches it")) from None
        if response.status_code != 200:
            hint = (f"check sasl.oauthbearer.client.id={self.client_id!r} and its sasl.oauthbearer.client.secret"
                    if response.status_code in (400, 401, 403) else "the identity provider refused the request")
            raise TransportError(self._scrub(f"{where} answered HTTP {response.status_code}{_oauth_error(response)}; "
                                             f"{hint}"))
        try:
            body = response.json()
            token = body["access_token"]
            lifetime = float(body.get("expires_in", DEFAULT_LIFETIME_S))
        except (ValueError, KeyError, TypeError):
            raise TransportError(f"{where} answered HTTP 200 without a JSON access_token (and a numeric "
                                 "expires_in): is it the token endpoint of an OIDC provider?") from None
        if not isinstance(token, str) or not token or lifetime <= 0:
            raise TransportError(f"{where} answered an empty access_token or expires_in <= 0")
        return token, lifetime

    def _scrub(self, message: str) -> str:
        """``message`` without the client secret: an identity provider's error text could echo it back."""
        return message.replace(self._secret.reveal(), str(self._secret)) if self._secret.reveal() else message


def _oauth_error(response: httpx.Response) -> str:
    """The identity provider's own reason (RFC 6749 5.2 ``error``, ``error_description``), short; '' if none."""
    try:
        body = response.json()
    except ValueError:
        return ""
    if not isinstance(body, dict):
        return ""
    parts = [str(body[k])[:200] for k in ("error", "error_description") if isinstance(body.get(k), str)]
    return f" ({': '.join(parts)})" if parts else ""
