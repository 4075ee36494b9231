"""The jar broker secured: a SASL_SSL listener, SCRAM/PLAIN users, mutual TLS and ACLs per role.

`tokentrail kafka up --secure` (and the secured integration tests) run the broker of
``compose.rig.kafka.broker`` with what this module prepares in ``<state dir>/secure``:

- a throw-away CA, the broker's certificate (SAN 127.0.0.1, localhost) and one client certificate,
  made at start with the openssl CLI (nothing is downloaded); the listener requires a client
  certificate (``ssl.client.auth=required``), so every process also exercises mutual TLS;
- one SASL user per role (`ROLES`), created in the KRaft metadata at format time (``--add-scram``),
  each with its own librdkafka-style client config file ``<role>.properties`` (what a process takes
  as ``--kafka-config``); passwords are random, the files mode 0600;
- the KRaft ``StandardAuthorizer``, ``allow.everyone.if.no.acl.found=false``, ``admin`` the only
  super user, and `role_acls`: the ACL table of docs/deploying.md, created by `apply_acls`.

The controller listener (loopback) speaks SASL_PLAINTEXT PLAIN with the admin's credentials: SCRAM
credentials live in the metadata log the controller serves, so they cannot authenticate it.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from schemas.errors import TokentrailError
from schemas.kafka.security import KafkaSecurity, load_kafka_config
from schemas.kafka.topics import TopicNames

# role -> SASL mechanism of its user (all three the broker offers are in use)
ROLES: dict[str, str] = {
    "admin": "SCRAM-SHA-512",  # super user: creates topics and ACLs
    "interceptor": "SCRAM-SHA-512",
    "processor": "SCRAM-SHA-512",
    "consumer": "SCRAM-SHA-256",
    "trainer": "SCRAM-SHA-256",
    "harness": "PLAIN",  # no ACL at all: a harness talks HTTP to the interceptor, never to Kafka
}
DEFAULT_PROCESSOR_ID = "tokentrail-processor"
DEFAULT_CONSUMER_GROUP = "tokentrail-consumer"


class SecureRigError(TokentrailError):
    """The secured broker's certificates, users or ACLs could not be made; the message says why."""


@dataclass(frozen=True)
class SecureRig:
    """The files of a secured broker in ``dir``: CA, keystores, one client config per role."""

    dir: Path

    def config_path(self, role: str) -> Path:
        if role not in ROLES:
            raise SecureRigError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
        return self.dir / f"{role}.properties"

    def security(self, role: str) -> KafkaSecurity:
        return load_kafka_config(self.config_path(role))

    def password(self, role: str) -> str:
        password = self.security(role).password
        assert password is not None
        return password.reveal()

    @property
    def ca(self) -> Path:
        return self.dir / "ca.pem"


def prepare(state_dir: Path) -> SecureRig:
    """Make (or keep) the CA, certificates, users and client configs under ``state_dir/secure``."""
    rig = SecureRig(Path(state_dir).resolve() / "secure")
    if all(rig.config_path(r).exists() for r in ROLES) and (rig.dir / "broker.p12").exists():
        return rig
    rig.dir.mkdir(parents=True, exist_ok=True)
    os.chmod(rig.dir, 0o700)
    _make_certificates(rig.dir)
    for role, mechanism in ROLES.items():
        path = rig.config_path(role)
        path.write_text(
            f"# {role} of the tokentrail secured test broker (compose.rig.kafka.secure)\n"
            "security.protocol=SASL_SSL\n"
            f"sasl.mechanism={mechanism}\n"
            f"sasl.username={role}\n"
            f"sasl.password={secrets.token_urlsafe(18)}\n"
            f"ssl.ca.location={rig.ca}\n"
            f"ssl.certificate.location={rig.dir / 'client.pem'}\n"
            f"ssl.key.location={rig.dir / 'client.key'}\n")
        os.chmod(path, 0o600)
    return rig


def _openssl(*args: str, cwd: Path) -> None:
    try:
        proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise SecureRigError("openssl not found on PATH: install it (apt-get install openssl) to make the "
                             "secured broker's certificates") from None
    if proc.returncode != 0:
        raise SecureRigError(f"openssl {' '.join(args[:2])} failed: {proc.stderr.strip()[-500:]}")


def _make_certificates(d: Path) -> None:
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "7",
             "-subj", "/CN=tokentrail-test-ca", "-addext", "basicConstraints=critical,CA:TRUE", cwd=d)
    for name, cn, ext in (("broker", "localhost", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
                          ("client", "tokentrail-client", "extendedKeyUsage=clientAuth")):
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}", cwd=d)
        (d / f"{name}.ext").write_text(ext + "\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "7", "-extfile", f"{name}.ext", cwd=d)
    # The broker's keystore as PKCS#12 (the JVM reads it without a key-format dance).
    _openssl("pkcs12", "-export", "-in", "broker.pem", "-inkey", "broker.key", "-certfile", "ca.pem",
             "-name", "broker", "-out", "broker.p12", "-passout", f"pass:{_store_password(d)}", cwd=d)
    for key in d.glob("*.key"):
        os.chmod(key, 0o600)


def _store_password(d: Path) -> str:
    path = d / "store.password"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(12))
        os.chmod(path, 0o600)
    return path.read_text().strip()


def server_properties(rig: SecureRig, *, broker_port: int, controller_port: int) -> dict[str, str]:
    """server.properties overrides: SASL_SSL for clients and brokers, SASL PLAIN for the controller, ACLs."""
    admin = rig.password("admin")
    store = _store_password(rig.dir)
    plain_users = " ".join(f'user_{r}="{rig.password(r)}"' for r, m in ROLES.items() if m == "PLAIN")
    return {
        "listeners": f"SASL_SSL://127.0.0.1:{broker_port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"SASL_SSL://127.0.0.1:{broker_port}",
        "inter.broker.listener.name": "SASL_SSL",
        "listener.security.protocol.map": "CONTROLLER:SASL_PLAINTEXT,SASL_SSL:SASL_SSL",
        "sasl.mechanism.controller.protocol": "PLAIN",
        "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.controller.plain.sasl.jaas.config":
            f'org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
            f'password="{admin}" user_admin="{admin}";',
        "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
        "listener.name.sasl_ssl.sasl.enabled.mechanisms": "SCRAM-SHA-512,SCRAM-SHA-256,PLAIN",
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config":
            f'org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="{admin}";',
        "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config":
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        "listener.name.sasl_ssl.plain.sasl.jaas.config":
            f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain_users};",
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": str(rig.dir / "broker.p12"),
        "ssl.keystore.password": store,
        "ssl.key.password": store,
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(rig.ca),
        "listener.name.sasl_ssl.ssl.client.auth": "required",  # mutual TLS (a bare ssl.client.auth: SSL only)
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "allow.everyone.if.no.acl.found": "false",
        "super.users": "User:admin",
    }


def scram_format_args(rig: SecureRig) -> list[str]:
    """StorageTool ``format`` arguments that create every SCRAM user in the new cluster's metadata."""
    args: list[str] = []
    for role, mechanism in ROLES.items():
        if mechanism.startswith("SCRAM"):
            args += ["--add-scram", f"{mechanism}=[name={role},password={rig.password(role)}]"]
    return args


# ------------------------------------------------------------------ ACLs

# (role, resource type, pattern type, name, operation)
Acl = tuple[str, str, str, str, str]


def role_acls(names: TopicNames | None = None, *, processor_id: str = DEFAULT_PROCESSOR_ID,
              consumer_group: str = DEFAULT_CONSUMER_GROUP) -> list[Acl]:
    """The ACL table of docs/deploying.md: what each role's principal may do, and nothing else."""
    n = names or TopicNames()
    return [
        # the interceptor: writes rollout events (captures, finishes), follows the announced versions and
        # reports the one it applied (schemas.version_reports: its heartbeat and, on a clean stop, its tombstone)
        ("interceptor", "TOPIC", "LITERAL", n.rollout_events, "WRITE"),
        # READ: draining its spool, it checks which uncertain records already landed (producers.capture.durable)
        ("interceptor", "TOPIC", "LITERAL", n.rollout_events, "READ"),
        ("interceptor", "TOPIC", "LITERAL", n.policy_versions, "READ"),
        ("interceptor", "TOPIC", "LITERAL", n.policy_versions_applied, "WRITE"),
        ("interceptor", "TOPIC", "LITERAL", n.policy_versions_applied, "READ"),
        # the processor: folds rollout-events into snapshots (and dead letters); its own changelog and
        # Faust's internal topics are prefixed with its app id, which is also its consumer group
        ("processor", "TOPIC", "LITERAL", n.rollout_events, "READ"),
        ("processor", "TOPIC", "LITERAL", n.snapshots, "WRITE"),
        ("processor", "TOPIC", "LITERAL", n.deadletter, "WRITE"),
        ("processor", "TOPIC", "PREFIXED", f"{processor_id}-", "ALL"),
        ("processor", "GROUP", "PREFIXED", processor_id, "READ"),
        # the consumer: reads snapshots, writes its sinks, retires delivered snapshots on rollout-events
        ("consumer", "TOPIC", "LITERAL", n.snapshots, "READ"),
        ("consumer", "TOPIC", "LITERAL", n.rebuilt, "WRITE"),
        ("consumer", "TOPIC", "LITERAL", n.rebuilt_groups, "WRITE"),
        ("consumer", "TOPIC", "LITERAL", n.deadletter, "WRITE"),
        ("consumer", "TOPIC", "LITERAL", n.rollout_events, "WRITE"),
        ("consumer", "TOPIC", "LITERAL", n.policy_versions, "READ"),
        ("consumer", "GROUP", "LITERAL", consumer_group, "READ"),
        # the trainer: announces policy versions (and waits for the interceptors' reports that they applied
        # one), reads what the Kafka sinks deliver
        ("trainer", "TOPIC", "LITERAL", n.policy_versions, "WRITE"),
        ("trainer", "TOPIC", "LITERAL", n.policy_versions, "READ"),
        ("trainer", "TOPIC", "LITERAL", n.policy_versions_applied, "READ"),
        ("trainer", "TOPIC", "LITERAL", n.rebuilt, "READ"),
        ("trainer", "TOPIC", "LITERAL", n.rebuilt_groups, "READ"),
        ("trainer", "GROUP", "PREFIXED", "tokentrail-trainer", "READ"),
    ]


def apply_acls(bootstrap: str, rig: SecureRig, acls: Iterable[Acl], *, timeout: float = 30.0) -> None:
    """Create ``acls`` as the admin; `SecureRigError` naming the first refused one."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    from schemas.kafka.bridge import admin_client

    bindings = [AclBinding(ResourceType[rtype], name, ResourcePatternType[pattern], f"User:{role}", "*",
                           AclOperation[op], AclPermissionType.ALLOW)
                for role, rtype, pattern, name, op in acls]
    admin = admin_client(bootstrap, security=rig.security("admin"))
    for binding, future in admin.create_acls(bindings, request_timeout=timeout).items():
        try:
            future.result(timeout=timeout)
        except Exception as exc:  # KafkaException, or the future's timeout
            raise SecureRigError(f"could not create the ACL {binding} on {bootstrap}: {exc}") from exc
