"""The Kafka client config file: parsed once, refused naming the key and the fix, translated, secrets redacted."""

from __future__ import annotations

import logging
import pickle

import pytest
from pydantic import ValidationError

from consumers.settings import ConsumerSettings
from processors.settings import ProcessorSettings
from producers.middleware_env import settings_from_env
from producers.settings import InterceptorSettings
from schemas.errors import ConfigError
from schemas.kafka.config import admin_config, consumer_config, producer_config
from schemas.kafka.security import (
    KafkaConfigError,
    KafkaSecurity,
    Secret,
    load_kafka_config,
    parse_kafka_config,
)

PASSWORD = "s3cr3t-Pa55word"


@pytest.fixture
def pem(tmp_path):
    for name in ("ca.pem", "client.pem", "client.key"):
        (tmp_path / name).write_text("-----BEGIN CERTIFICATE-----\n")
    return tmp_path


def write(tmp_path, text, name="client.properties"):
    path = tmp_path / name
    path.write_text(text)
    return path


def scram(pem, **more):
    lines = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "alice",
             "sasl.password": PASSWORD, "ssl.ca.location": str(pem / "ca.pem"), **more}
    return "# a comment\n\n" + "".join(f"{k}={v}\n" for k, v in lines.items())


def test_a_scram_sasl_ssl_file_parses_and_translates_to_both_clients(pem):
    sec = load_kafka_config(write(pem, scram(pem)))
    assert (sec.protocol, sec.mechanism, sec.username, sec.tls, sec.sasl) == ("SASL_SSL", "SCRAM-SHA-512", "alice",
                                                                             True, True)
    assert sec.librdkafka() == {
        "security.protocol": "sasl_ssl", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "alice",
        "sasl.password": PASSWORD, "ssl.ca.location": str(pem / "ca.pem"),
        "ssl.endpoint.identification.algorithm": "https"}


def test_aiokafka_auth_carries_sasl_and_a_tls_context(tmp_path):
    sec = parse_kafka_config({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "u",
                              "sasl.password": PASSWORD})  # no CA: the system's
    auth = sec.aiokafka_auth()
    assert auth["security_protocol"] == "SASL_SSL" and auth["sasl_mechanism"] == "PLAIN"
    assert auth["sasl_plain_username"] == "u" and auth["sasl_plain_password"] == PASSWORD
    assert auth["ssl_context"].check_hostname


def test_every_client_builder_gets_the_same_security_and_extra_cannot_override_it(pem):
    sec = load_kafka_config(write(pem, scram(pem)))
    for config in (producer_config("b:1", security=sec), consumer_config("b:1", "g", security=sec),
                   admin_config("b:1", security=sec)):
        assert config["sasl.password"] == PASSWORD and config["security.protocol"] == "sasl_ssl"
    with pytest.raises(ValueError, match="sasl.username: how a client authenticates") as err:
        producer_config("b:1", security=sec, extra={"sasl.username": "mallory"})
    assert PASSWORD not in str(err.value)
    assert "security.protocol" not in producer_config("b:1")  # no file: PLAINTEXT, librdkafka's default


@pytest.mark.parametrize(("text", "names"), [
    ("security.protocol=SASL_SSL\nsasl.mechanism=GSSAPI\n", ["GSSAPI", "SCRAM-SHA-512"]),
    ("security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-1\nsasl.username=a\nsasl.password=b\n",
     ["sasl.mechanism='SCRAM-SHA-1'", "SCRAM-SHA-256"]),
    ("security.protocol=TLS\n", ["security.protocol='TLS'", "SASL_SSL"]),
    ("security.protocol=SASL_SSL\n", ["needs sasl.mechanism"]),
    ("security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\nsasl.username=a\n", ["needs sasl.password"]),
    ("security.protocol=SSL\nsasl.mechanism=PLAIN\n", ["needs security.protocol=SASL_SSL"]),
    ("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.username=a\nsasl.password=b\n"
     "ssl.ca.location=/x\n", ["uses no TLS", "SASL_SSL"]),
    ("security.protocol=SSL\nssl.ca.location=/no/such/ca.pem\n", ["ssl.ca.location='/no/such/ca.pem'", "no such file"]),
    ("acks=all\n", ["unknown key 'acks'", "security.protocol"]),
    ("bootstrap.servers=x:9092\n", ["bootstrap.servers", "--bootstrap"]),
    ("sasl.jaas.config=org.apache...PlainLoginModule required;\n", ["sasl.jaas.config", "sasl.username"]),
    ("security.protocol\n", ["not a key=value line"]),
    ("security.protocol=SSL\nsecurity.protocol=SSL\n", ["set twice"]),
    ("security.protocol=SASL_SSL\nsasl.mechanism=OAUTHBEARER\nsasl.oauthbearer.client.id=c\n",
     ["sasl.oauthbearer.token.endpoint.url"]),
    ("security.protocol=SSL\nssl.endpoint.identification.algorithm=maybe\n", ["'https'", "'none'"]),
])
def test_a_bad_file_is_refused_naming_the_key_and_the_fix(tmp_path, text, names):
    path = write(tmp_path, text)
    with pytest.raises(KafkaConfigError) as err:
        load_kafka_config(path)
    assert isinstance(err.value, ConfigError)
    assert str(path) in str(err.value)
    for name in names:
        assert name in str(err.value)


def test_a_client_certificate_needs_its_key(pem):
    with pytest.raises(KafkaConfigError, match="ssl.certificate.location is set without ssl.key.location"):
        load_kafka_config(write(pem, scram(pem, **{"ssl.certificate.location": "client.pem"})))
    sec = load_kafka_config(write(pem, scram(pem, **{"ssl.certificate.location": "client.pem",
                                                     "ssl.key.location": "client.key"})))
    assert sec.certificate_location == str(pem / "client.pem")  # relative to the file


def test_a_missing_file_names_the_flag(tmp_path):
    with pytest.raises(KafkaConfigError, match="--kafka-config .*cannot read it"):
        load_kafka_config(tmp_path / "absent.properties")


def test_oauthbearer_translates_for_librdkafka_and_asks_aiokafka_for_a_token_provider():
    sec = parse_kafka_config({"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
                              "sasl.oauthbearer.method": "oidc", "sasl.oauthbearer.client.id": "cid",
                              "sasl.oauthbearer.client.secret": PASSWORD,
                              "sasl.oauthbearer.token.endpoint.url": "https://idp.example/token"})
    assert sec.librdkafka()["sasl.oauthbearer.client.secret"] == PASSWORD
    assert sec.librdkafka()["sasl.oauthbearer.method"] == "oidc"
    with pytest.raises(KafkaConfigError, match="token provider"):
        sec.aiokafka_auth()  # the processor passes processors.oauth.OidcTokenProvider (tests/unit/processors)
    provider = object()
    assert sec.aiokafka_auth(token_provider=provider)["sasl_oauth_token_provider"] is provider
    assert PASSWORD not in repr(sec)


def test_secrets_never_show_in_repr_str_logs_or_settings(pem, caplog):
    path = write(pem, scram(pem, **{"ssl.certificate.location": "client.pem", "ssl.key.location": "client.key",
                                     "ssl.key.password": PASSWORD + "-key"}))
    sec = load_kafka_config(path)
    settings = [InterceptorSettings(upstream_url="http://127.0.0.1:8000", bootstrap="b:1", kafka=str(path)),
                ProcessorSettings(bootstrap="b:1", kafka=path), ConsumerSettings(bootstrap="b:1", kafka=str(path))]
    with caplog.at_level(logging.INFO):
        logging.getLogger("t").info("settings %s %r %s", sec, sec, settings)
    shown = [repr(sec), str(sec), sec.describe(), caplog.text, repr(Secret(PASSWORD)), str(Secret(PASSWORD)),
             *(repr(s) for s in settings), *(s.model_dump_json() for s in settings), *(str(s) for s in settings)]
    for text in shown:
        assert PASSWORD not in text
    assert "**********" in repr(sec) and sec.describe() == "SASL_SSL SCRAM-SHA-512 user alice"
    assert pickle.loads(pickle.dumps(sec)) == sec  # pickles with the value (child processes), equal


def test_the_settings_field_refuses_a_bad_file_naming_it(tmp_path):
    path = write(tmp_path, "security.protocol=SASL_SSL\nsasl.mechanism=KERBEROS\n")
    for build in (lambda: ProcessorSettings(bootstrap="b:1", kafka=str(path)),
                  lambda: ConsumerSettings(bootstrap="b:1", kafka=str(path))):
        with pytest.raises(ValidationError, match="sasl.mechanism='KERBEROS'"):
            build()
    with pytest.raises(ValidationError, match="expected the path"):
        ConsumerSettings(bootstrap="b:1", kafka={"sasl.password": PASSWORD})
    assert ProcessorSettings(bootstrap="b:1").kafka == KafkaSecurity()


def test_the_vllm_middleware_reads_tokentrail_kafka_config(pem):
    path = write(pem, scram(pem))
    settings = settings_from_env({"TOKENTRAIL_BOOTSTRAP": "b:1", "TOKENTRAIL_KAFKA_CONFIG": str(path)})
    assert settings.kafka.username == "alice"
    with pytest.raises(ConfigError, match="TOKENTRAIL_KAFKA_CONFIG"):
        settings_from_env({"TOKENTRAIL_BOOTSTRAP": "b:1", "TOKENTRAIL_KAFKA_CONFIG": str(pem / "none")})


def test_the_processor_hands_faust_sasl_credentials_over_tls():
    import faust

    from processors.app import faust_credentials

    sec = parse_kafka_config({"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256",
                              "sasl.username": "proc", "sasl.password": PASSWORD})
    creds = faust_credentials(sec)
    assert isinstance(creds, faust.SASLCredentials)
    assert (creds.protocol.value, creds.mechanism.value, creds.username) == ("SASL_SSL", "SCRAM-SHA-256", "proc")
    assert creds.ssl_context is not None and PASSWORD not in repr(creds)
    assert faust_credentials(KafkaSecurity()) is None
    assert isinstance(faust_credentials(parse_kafka_config({"security.protocol": "SSL"})), faust.SSLCredentials)
