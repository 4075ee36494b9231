"""The Faust processor's OAUTHBEARER token provider: one OIDC client-credentials fetch per token lifetime,
errors naming the token URL and the HTTP status, the secret never shown (an httpx MockTransport, a fake clock)."""

from __future__ import annotations

import asyncio
import base64
import logging
from urllib.parse import parse_qs

import faust
import httpx
import pytest
from aiokafka.abc import AbstractTokenProvider

from processors.app import faust_credentials
from processors.oauth import OidcTokenProvider
from schemas.errors import TransportError
from schemas.kafka.security import KafkaConfigError, Secret, parse_kafka_config

URL = "https://idp.example/oauth2/token"
SECRET = "cl1ent-s3cret-Value"


class IdP:
    """A token endpoint: answers ``status`` with tokens tok-1, tok-2... living ``expires_in`` s; records requests."""

    def __init__(self, status: int = 200, expires_in: float = 100.0, body: dict | None = None) -> None:
        self.status, self.expires_in, self.body = status, expires_in, body
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.status != 200:
            return httpx.Response(self.status, json=self.body or {})
        return httpx.Response(200, json={"access_token": f"tok-{len(self.requests)}", "token_type": "Bearer",
                                         "expires_in": self.expires_in})


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def provider(idp: IdP, clock: Clock | None = None, scope: str | None = "kafka") -> OidcTokenProvider:
    return OidcTokenProvider(URL, "proc-client", Secret(SECRET), scope, transport=httpx.MockTransport(idp),
                             clock=clock or Clock())


async def test_a_client_credentials_request_and_the_token_cached_until_shortly_before_expiry():
    idp, clock = IdP(expires_in=100.0), Clock()
    p = provider(idp, clock)
    assert await p.token() == "tok-1"
    request = idp.requests[0]
    assert (request.method, str(request.url)) == ("POST", URL)
    assert parse_qs(request.content.decode()) == {"grant_type": ["client_credentials"], "scope": ["kafka"]}
    assert request.headers["authorization"] == "Basic " + base64.b64encode(f"proc-client:{SECRET}".encode()).decode()
    clock.now += 79.0  # 80 % of the lifetime: still the cached one
    assert await p.token() == "tok-1" and len(idp.requests) == 1
    clock.now += 2.0  # past the refresh point (20 % of the lifetime left)
    assert await p.token() == "tok-2" and len(idp.requests) == 2


async def test_concurrent_connections_share_one_fetch():
    idp = IdP()
    p = provider(idp)
    assert await asyncio.gather(*(p.token() for _ in range(8))) == ["tok-1"] * 8
    assert len(idp.requests) == 1


async def test_a_401_names_the_url_the_status_and_the_client_never_the_secret(caplog):
    idp = IdP(status=401, body={"error": "invalid_client", "error_description": f"bad secret {SECRET}"})
    with caplog.at_level(logging.DEBUG), pytest.raises(TransportError) as info:
        await provider(idp).token()
    message = str(info.value)
    assert URL in message and "HTTP 401" in message and "invalid_client" in message
    assert "sasl.oauthbearer.client.id='proc-client'" in message
    basic = base64.b64encode(f"proc-client:{SECRET}".encode()).decode()  # what the Authorization header holds
    for text in (message, caplog.text, repr(provider(idp))):
        assert SECRET not in text and basic not in text


async def test_a_server_error_an_unreachable_url_and_a_bad_body_are_transport_errors_naming_the_url():
    with pytest.raises(TransportError, match=f"{URL}.*HTTP 503"):
        await provider(IdP(status=503)).token()

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    unreachable = OidcTokenProvider(URL, "c", Secret(SECRET), transport=httpx.MockTransport(down))
    with pytest.raises(TransportError, match=f"{URL}.*no answer.*ConnectError"):
        await unreachable.token()
    html = OidcTokenProvider(URL, "c", Secret(SECRET), transport=httpx.MockTransport(
        lambda request: httpx.Response(200, text="<html>login</html>")))
    with pytest.raises(TransportError, match=f"{URL}.*without a JSON access_token"):
        await html.token()


def test_the_processor_hands_faust_oauth_credentials_with_the_provider():
    security = parse_kafka_config({"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
                                   "sasl.oauthbearer.method": "oidc", "sasl.oauthbearer.client.id": "proc-client",
                                   "sasl.oauthbearer.client.secret": SECRET,
                                   "sasl.oauthbearer.token.endpoint.url": URL, "sasl.oauthbearer.scope": "kafka"})
    creds = faust_credentials(security)
    assert isinstance(creds, faust.OAuthCredentials)
    assert (creds.protocol.value, creds.mechanism.value) == ("SASL_SSL", "OAUTHBEARER")
    assert isinstance(creds.oauth_cb, AbstractTokenProvider)  # aiokafka's connection checks exactly this
    assert (creds.oauth_cb.token_url, creds.oauth_cb.client_id, creds.oauth_cb.scope) == (URL, "proc-client", "kafka")
    assert creds.ssl_context is not None and SECRET not in repr(creds) + repr(creds.oauth_cb)
    auth = security.aiokafka_auth(token_provider=creds.oauth_cb)
    assert auth["sasl_oauth_token_provider"] is creds.oauth_cb and "sasl_plain_password" not in auth
    with pytest.raises(KafkaConfigError, match="token provider"):
        security.aiokafka_auth()
    with pytest.raises(KafkaConfigError, match="OAUTHBEARER"):
        OidcTokenProvider.of(parse_kafka_config({"security.protocol": "SSL"}))


async def test_faust_hands_the_provider_to_aiokafka_which_sends_its_token():
    from aiokafka.conn import AIOKafkaConnection, OAuthAuthenticator
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    security = parse_kafka_config({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER",
                                   "sasl.oauthbearer.client.id": "proc-client",
                                   "sasl.oauthbearer.client.secret": SECRET,
                                   "sasl.oauthbearer.token.endpoint.url": URL})
    creds = faust_credentials(security)
    creds.oauth_cb._transport = httpx.MockTransport(IdP())  # the network of this test
    auth = credentials_to_aiokafka_auth(creds)  # what faust gives its aiokafka consumer and producer
    assert (auth["security_protocol"], auth["sasl_mechanism"]) == ("SASL_PLAINTEXT", "OAUTHBEARER")
    AIOKafkaConnection("127.0.0.1", 9, **auth)  # aiokafka's own check of the provider (no connection made)
    frame, _ = await OAuthAuthenticator(sasl_oauth_token_provider=auth["sasl_oauth_token_provider"]).step(b"")
    assert b"auth=Bearer tok-1" in frame
