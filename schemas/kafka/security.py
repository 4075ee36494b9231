"""How every tokentrail process authenticates to Kafka: one client config file, parsed once (pure).

The file is librdkafka's own format (``key=value`` lines, ``#`` comments), the same a Confluent Cloud
or MSK "client configuration" page hands out for librdkafka clients, restricted to the settings that
say how to connect securely. Every process takes it the same way: ``--kafka-config FILE`` or the
environment variable ``TOKENTRAIL_KAFKA_CONFIG`` (the vLLM middleware reads only the environment).

Guarantees:

- Parsed once into a frozen `KafkaSecurity`, validated before any I/O of the process: an unknown
  key, a wrong mechanism, a file that is not there, a client certificate without its key, SASL
  settings on a protocol without SASL... each is a `KafkaConfigError` naming the key, the value and
  the fix.
- Translated here, and only here, to the settings of both client libraries: `librdkafka` (the
  confluent-kafka clients: interceptor, consumer, sinks, the CLIs) and `aiokafka_auth` (the Faust
  processor, wrapped in Faust's credential classes by ``processors.app``).
- Secrets (``sasl.password``, ``ssl.key.password``, ``sasl.oauthbearer.client.secret``) are `Secret`
  values: their repr and str are redacted, so settings can be logged and printed; only the two
  translations reveal them, to the client library.

What is supported: security.protocol PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL; TLS with a CA file and
an optional client certificate (mutual TLS); SASL PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 in every process;
SASL OAUTHBEARER with ``sasl.oauthbearer.method=oidc`` (client-credentials grant) in every process: librdkafka
fetches the token itself, the Faust processor's aiokafka through ``processors.oauth.OidcTokenProvider``.
GSSAPI (Kerberos) is refused: neither client here ships its libraries.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schemas.errors import ConfigError

__all__ = ["KafkaSecurity", "KafkaConfigError", "Secret", "ENV_VAR", "PROTOCOLS", "MECHANISMS",
           "load_kafka_config", "parse_kafka_config", "kafka_security_of", "security_from_env",
           "add_kafka_config_option", "security_of_args"]

ENV_VAR = "TOKENTRAIL_KAFKA_CONFIG"
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
REDACTED = "**********"

# Keys of a managed service's sample file that are no connection security setting: what to do instead.
_NOT_HERE = {
    "bootstrap.servers": "give the bootstrap with --bootstrap (or TOKENTRAIL_BOOTSTRAP where the process reads "
                         "the environment); this file holds only how to connect securely",
    "sasl.jaas.config": "that is the Java client's syntax; write sasl.username=... and sasl.password=... instead",
    "sasl.kerberos.service.name": "GSSAPI (Kerberos) is not supported; use SCRAM-SHA-512, PLAIN or OAUTHBEARER",
}


class KafkaConfigError(ConfigError):
    """The Kafka client config file is unreadable or invalid; the message names the key, the value and the fix."""


class Secret:
    """A secret string whose repr and str never show it; ``reveal()`` hands it to a client library."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"Secret('{REDACTED}')"

    def __str__(self) -> str:
        return REDACTED

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __reduce__(self) -> Any:  # pickling (multiprocessing) keeps the value; printing never shows it
        return (Secret, (self._value,))


@dataclass(frozen=True, slots=True, kw_only=True)
class KafkaSecurity:
    """How to connect to Kafka securely (see the module docstring); `PLAINTEXT` when no file is given."""

    protocol: str = "PLAINTEXT"
    mechanism: str | None = None
    username: str | None = None
    password: Secret | None = None
    ca_location: str | None = None
    certificate_location: str | None = None
    key_location: str | None = None
    key_password: Secret | None = None
    verify_hostname: bool = True
    oauth_token_url: str | None = None
    oauth_client_id: str | None = None
    oauth_client_secret: Secret | None = None
    oauth_scope: str | None = None
    # The file it was read from: for messages, and for the child processes a tool starts (they take the file).
    source: str = field(default="", compare=False)

    # -- translations -------------------------------------------------------------------------
    def librdkafka(self) -> dict[str, Any]:
        """The settings of a confluent-kafka (librdkafka) client, secrets revealed: hand them to the client only.

        PLAINTEXT (no file) adds nothing: librdkafka's default.
        """
        if not self.secured:
            return {}
        config: dict[str, Any] = {"security.protocol": self.protocol.lower()}
        if self.mechanism is not None:
            config["sasl.mechanism"] = self.mechanism
        if self.mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
            config["sasl.username"] = self.username
            config["sasl.password"] = _reveal(self.password)
        elif self.mechanism == "OAUTHBEARER":
            config.update({"sasl.oauthbearer.method": "oidc",
                           "sasl.oauthbearer.token.endpoint.url": self.oauth_token_url,
                           "sasl.oauthbearer.client.id": self.oauth_client_id,
                           "sasl.oauthbearer.client.secret": _reveal(self.oauth_client_secret)})
            if self.oauth_scope:
                config["sasl.oauthbearer.scope"] = self.oauth_scope
        if self.tls:
            for key, value in (("ssl.ca.location", self.ca_location),
                               ("ssl.certificate.location", self.certificate_location),
                               ("ssl.key.location", self.key_location)):
                if value is not None:
                    config[key] = value
            if self.key_password is not None:
                config["ssl.key.password"] = self.key_password.reveal()
            config["ssl.endpoint.identification.algorithm"] = "https" if self.verify_hostname else "none"
        return config

    def aiokafka_auth(self, *, token_provider: Any = None) -> dict[str, Any]:
        """aiokafka's auth settings (``security_protocol``, ``sasl_*``, ``ssl_context``), secrets revealed.

        Reads the certificate files (an ``ssl.SSLContext``): call it where the client is built.
        OAUTHBEARER needs ``token_provider`` (an ``aiokafka.abc.AbstractTokenProvider``: aiokafka fetches no
        token itself; the processor's is ``processors.oauth.OidcTokenProvider``), else `KafkaConfigError`.
        """
        auth: dict[str, Any] = {"security_protocol": self.protocol}
        if self.mechanism == "OAUTHBEARER":
            if token_provider is None:
                raise KafkaConfigError(
                    f"{self._where()}sasl.mechanism=OAUTHBEARER: an aiokafka client needs a token provider "
                    "(processors.oauth.OidcTokenProvider builds one from this file's sasl.oauthbearer.* settings)")
            auth.update(sasl_mechanism=self.mechanism, sasl_oauth_token_provider=token_provider)
        elif self.mechanism is not None:
            auth.update(sasl_mechanism=self.mechanism, sasl_plain_username=self.username,
                        sasl_plain_password=_reveal(self.password))
        if self.tls:
            auth["ssl_context"] = self.ssl_context()
        return auth

    def ssl_context(self) -> ssl.SSLContext:
        """A client TLS context: the CA file (or the system's CAs), the client certificate if any."""
        try:
            context = ssl.create_default_context(cafile=self.ca_location)
            if self.certificate_location is not None:
                context.load_cert_chain(self.certificate_location, self.key_location,
                                        password=_reveal(self.key_password) if self.key_password else None)
        except (ssl.SSLError, OSError) as exc:
            raise KafkaConfigError(f"{self._where()}cannot load the TLS files (ssl.ca.location={self.ca_location}, "
                                   f"ssl.certificate.location={self.certificate_location}, ssl.key.location="
                                   f"{self.key_location}): {exc}; check they are PEM files and the key matches "
                                   "the certificate") from exc
        if not self.verify_hostname:
            context.check_hostname = False
        return context

    # -- facts ----------------------------------------------------------------------------------
    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @property
    def secured(self) -> bool:
        return self.protocol != "PLAINTEXT"

    def describe(self) -> str:
        """One line for logs: protocol, mechanism, user; never a secret."""
        parts = [self.protocol]
        if self.mechanism:
            parts.append(self.mechanism)
        if self.username:
            parts.append(f"user {self.username}")
        elif self.oauth_client_id:
            parts.append(f"client {self.oauth_client_id}")
        return " ".join(parts)

    def _where(self) -> str:
        return f"{self.source}: " if self.source else ""


def _reveal(secret: Secret | None) -> str | None:
    return secret.reveal() if secret is not None else None


# ------------------------------------------------------------------ parsing

# file key -> KafkaSecurity field
_KEYS = {
    "security.protocol": "protocol",
    "sasl.mechanism": "mechanism",
    "sasl.mechanisms": "mechanism",  # librdkafka's alias
    "sasl.username": "username",
    "sasl.password": "password",
    "ssl.ca.location": "ca_location",
    "ssl.certificate.location": "certificate_location",
    "ssl.key.location": "key_location",
    "ssl.key.password": "key_password",
    "ssl.endpoint.identification.algorithm": "verify_hostname",
    "sasl.oauthbearer.method": "",  # only oidc; checked below
    "sasl.oauthbearer.token.endpoint.url": "oauth_token_url",
    "sasl.oauthbearer.client.id": "oauth_client_id",
    "sasl.oauthbearer.client.secret": "oauth_client_secret",
    "sasl.oauthbearer.scope": "oauth_scope",
}
_SECRETS = {"password", "key_password", "oauth_client_secret"}
_FILES = ("ca_location", "certificate_location", "key_location")


def load_kafka_config(path: str | os.PathLike[str]) -> KafkaSecurity:
    """Read and validate the client config file ``path``; `KafkaConfigError` naming the problem."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise KafkaConfigError(f"--kafka-config {p}: cannot read it ({exc.strerror or exc}); give the path of a "
                               "librdkafka-style client config file (key=value lines, see docs/deploying.md)") from None
    except UnicodeDecodeError:
        raise KafkaConfigError(f"--kafka-config {p}: not a UTF-8 text file; give a key=value properties file") from None
    properties: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise KafkaConfigError(f"{p}:{number}: {line.split()[0][:40]!r} is not a key=value line "
                                   "(e.g. security.protocol=SASL_SSL)")
        key = key.strip()
        if key in properties:
            raise KafkaConfigError(f"{p}:{number}: {key} is set twice; keep one line")
        properties[key] = value.strip()
    return parse_kafka_config(properties, source=str(p), base=p.parent)


def parse_kafka_config(properties: Mapping[str, str], *, source: str = "",
                       base: Path | None = None) -> KafkaSecurity:
    """Validate librdkafka-named ``properties`` into a `KafkaSecurity` (relative paths from ``base``)."""
    where = f"{source}: " if source else ""

    def fail(message: str) -> KafkaConfigError:
        return KafkaConfigError(where + message)

    values: dict[str, Any] = {}
    for key, value in properties.items():
        if key in _NOT_HERE:
            raise fail(f"{key}: {_NOT_HERE[key]}")
        if key not in _KEYS:
            raise fail(f"unknown key {key!r}: the file takes only {', '.join(sorted(set(_KEYS)))} "
                       "(tokentrail sets every other client setting itself)")
        name = _KEYS[key]
        if not isinstance(value, str):
            raise fail(f"{key}: expected a string, got {type(value).__name__}")
        if name == "":
            if value.lower() != "oidc":
                raise fail(f"sasl.oauthbearer.method={value!r}: only 'oidc' (client credentials against "
                           "sasl.oauthbearer.token.endpoint.url) is supported")
            continue
        if name in values:
            raise fail(f"{key}: sasl.mechanism and sasl.mechanisms are the same setting; keep one")
        if value == "" and name not in _SECRETS:
            raise fail(f"{key} is empty; give a value or remove the line")
        values[name] = value

    protocol = values.get("protocol", "PLAINTEXT").upper()
    if protocol not in PROTOCOLS:
        raise fail(f"security.protocol={values['protocol']!r} is not one of {', '.join(PROTOCOLS)}")
    values["protocol"] = protocol
    tls, sasl = protocol in ("SSL", "SASL_SSL"), protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    mechanism = values.get("mechanism")
    if mechanism is not None:
        mechanism = values["mechanism"] = mechanism.upper()
        if mechanism == "GSSAPI":
            raise fail("sasl.mechanism=GSSAPI: Kerberos is not supported; use SCRAM-SHA-512, SCRAM-SHA-256, PLAIN "
                       "or OAUTHBEARER")
        if mechanism not in MECHANISMS:
            raise fail(f"sasl.mechanism={values['mechanism']!r} is not one of {', '.join(MECHANISMS)}")
        if not sasl:
            raise fail(f"sasl.mechanism={mechanism} needs security.protocol=SASL_SSL (or SASL_PLAINTEXT), "
                       f"not {protocol}")
    elif sasl:
        raise fail(f"security.protocol={protocol} needs sasl.mechanism ({', '.join(MECHANISMS)})")

    for name in ("username", "password"):
        if name in values and mechanism not in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
            raise fail(f"sasl.{name} is set but sasl.mechanism is {mechanism}: it takes effect only with PLAIN "
                       "or SCRAM-SHA-*; remove it or set the mechanism")
    if mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
        for name in ("username", "password"):
            if not values.get(name):
                raise fail(f"sasl.mechanism={mechanism} needs sasl.{name}")
    oauth = [k for k in ("oauth_token_url", "oauth_client_id", "oauth_client_secret", "oauth_scope") if k in values]
    if oauth and mechanism != "OAUTHBEARER":
        raise fail(f"sasl.oauthbearer.* is set but sasl.mechanism is {mechanism}: set sasl.mechanism=OAUTHBEARER "
                   "or remove those lines")
    if mechanism == "OAUTHBEARER":
        for name, key in (("oauth_token_url", "sasl.oauthbearer.token.endpoint.url"),
                          ("oauth_client_id", "sasl.oauthbearer.client.id"),
                          ("oauth_client_secret", "sasl.oauthbearer.client.secret")):
            if not values.get(name):
                raise fail(f"sasl.mechanism=OAUTHBEARER needs {key} (sasl.oauthbearer.method=oidc)")
        if not values["oauth_token_url"].startswith("https://"):
            raise fail(f"sasl.oauthbearer.token.endpoint.url={values['oauth_token_url']!r}: must be an https:// URL "
                       "(the client secret is sent to it)")

    tls_keys = [k for k in (*_FILES, "key_password", "verify_hostname") if k in values]
    if tls_keys and not tls:
        raise fail(f"ssl.* settings are set but security.protocol={protocol} uses no TLS: set security.protocol="
                   f"{'SASL_SSL' if sasl else 'SSL'} or remove them")
    for name in _FILES:
        if name in values:
            path = Path(os.path.expanduser(values[name]))
            if not path.is_absolute() and base is not None:
                path = base / path
            key = next(k for k, v in _KEYS.items() if v == name)
            if not path.is_file():
                raise fail(f"{key}={values[name]!r}: no such file ({path}); give the path of the PEM file")
            try:
                path.open("rb").close()
            except OSError as exc:
                raise fail(f"{key}={values[name]!r}: cannot read it ({exc.strerror}); fix its permissions") from None
            values[name] = str(path)
    if ("certificate_location" in values) != ("key_location" in values):
        have, lack = (("ssl.certificate.location", "ssl.key.location") if "certificate_location" in values
                      else ("ssl.key.location", "ssl.certificate.location"))
        raise fail(f"{have} is set without {lack}: a client certificate needs both (or neither)")
    if "key_password" in values and "key_location" not in values:
        raise fail("ssl.key.password is set without ssl.key.location; remove it or add the key")
    if "verify_hostname" in values:
        algorithm = values["verify_hostname"].lower()
        if algorithm not in ("https", "none"):
            raise fail(f"ssl.endpoint.identification.algorithm={values['verify_hostname']!r} is not 'https' "
                       "(check the broker's name, the default) or 'none'")
        values["verify_hostname"] = algorithm == "https"

    for name in _SECRETS & set(values):
        values[name] = Secret(values[name])
    return KafkaSecurity(**values, source=source)


def kafka_security_of(value: Any) -> KafkaSecurity:
    """Coerce a settings value: a `KafkaSecurity`, None (PLAINTEXT) or the path of a client config file.

    The one rule every process's settings model applies to its ``kafka`` field (pydantic validator);
    raises ValueError (pydantic's) with the `KafkaConfigError` message.
    """
    if isinstance(value, KafkaSecurity):
        return value
    try:
        if value is None:
            return KafkaSecurity()
        if isinstance(value, str | os.PathLike):
            return load_kafka_config(value)
    except KafkaConfigError as exc:
        raise ValueError(str(exc)) from None
    # Never echo the value: a mapping could hold a password (build one with parse_kafka_config instead).
    raise ValueError(f"kafka: expected the path of a client config file, got a {type(value).__name__}")


def security_from_env(environ: Mapping[str, str] | None = None) -> KafkaSecurity:
    """The `KafkaSecurity` of ``$TOKENTRAIL_KAFKA_CONFIG`` (a file path), PLAINTEXT if unset."""
    path = (os.environ if environ is None else environ).get(ENV_VAR)
    return load_kafka_config(path) if path else KafkaSecurity()


def add_kafka_config_option(parser: Any, *, note: str = "") -> None:
    """The one ``--kafka-config FILE`` flag of every command that talks to Kafka (default ``$TOKENTRAIL_KAFKA_CONFIG``).

    ``note``: what the command adds to the help (e.g. that it needs ``--bootstrap``).
    """
    parser.add_argument("--kafka-config", metavar="FILE", default=os.environ.get(ENV_VAR) or None,
                        help="librdkafka-style client config file: security.protocol, sasl.*, ssl.* (TLS, SASL "
                             f"PLAIN/SCRAM/OAUTHBEARER; docs/deploying.md); default ${ENV_VAR}; none: PLAINTEXT"
                             + (f"; {note}" if note else ""))


def security_of_args(args: Any) -> KafkaSecurity:
    """The `KafkaSecurity` a command's ``--kafka-config`` names (PLAINTEXT without one); `KafkaConfigError` if invalid."""
    path = getattr(args, "kafka_config", None)
    return load_kafka_config(path) if path else KafkaSecurity()
