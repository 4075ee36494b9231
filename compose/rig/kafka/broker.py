"""One Apache Kafka broker on loopback, run from Maven Central jars (no Docker).

Guarantees: `start_broker` returns only once the broker answers a metadata request on
the bootstrap address it reports, and reuses a live broker recorded in ``broker.json``
instead of starting a second one; `stop_broker` signals only a pid that is still a
Kafka JVM (never a process that inherited a recycled pid) and removes the broker's
data, because this broker is ephemeral. Every failure is a `BrokerError` whose
message names what is missing and how to fix it. Also the `tokentrail kafka` command.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from compose import REPO_ROOT
from compose.procs.service import pick_free_ports
from compose.rig.kafka.jars import (
    BrokerError,
    ensure_jars,
    find_java,
    java_command,
    kafka_version,
    tail_of,
)
from schemas.errors import TokentrailError

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
_BROKER_MAIN = "kafka.Kafka"
# For a broker a test kills and restarts: a KRaft node restarted after kill -9 waits out its previous
# registration's session before it serves (broker.session.timeout.ms, 9 s by default): 13-16 s per
# restart here, 9 s with these.
FAST_RESTART = {"broker.session.timeout.ms": "3000", "broker.heartbeat.interval.ms": "500"}
_RECORD_KEYS = ("pid", "bootstrap", "controller_port", "data_dir", "kafka_version", "started_at")

# Brokers this process launched: we are their parent, so a dead one stays a zombie
# (still signalable) until reaped; `Popen.poll()` is the only honest liveness test.
_CHILDREN: dict[int, subprocess.Popen] = {}


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    pid: int
    bootstrap: str
    controller_port: int
    data_dir: str
    kafka_version: str
    started_at: float
    reused: bool = False
    startup_s: float | None = None  # launch to ready; None when reused or read back
    kafka_config: str | None = None  # secured (--secure): the admin's client config file; None: PLAINTEXT


def default_state_dir() -> Path:
    return Path(os.environ.get("TOKENTRAIL_KAFKA_DIR") or REPO_ROOT / ".tokentrail" / "kafka")


# ---------------------------------------------------------------- configuration

def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, base64url without padding (22 chars), no JVM needed.

    Like Kafka's own ``Uuid.randomUuid``, never one that starts with "-": StorageTool's
    argument parser would read it as an option (1 id in 64 otherwise).
    """
    while (cid := base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode())[0] == "-":
        pass
    return cid


def render_server_properties(*, broker_port: int, controller_port: int, data_dir: Path | str,
                             partitions: int = 4, properties: Mapping[str, str] | None = None) -> str:
    """server.properties for one combined broker+controller node with a static quorum.

    ``properties`` are appended, so they override the defaults above (Kafka keeps the last value of a key).
    """
    extra = "".join(f"{key}={value}\n" for key, value in (properties or {}).items())
    return _base_properties(broker_port, controller_port, data_dir, partitions) + extra


def _base_properties(broker_port: int, controller_port: int, data_dir: Path | str, partitions: int) -> str:
    p = partitions
    return f"""\
process.roles=broker,controller
node.id=1
# static voters: the controller port is known up front, so storage is formatted without --standalone
controller.quorum.voters=1@127.0.0.1:{controller_port}
listeners=PLAINTEXT://127.0.0.1:{broker_port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners=PLAINTEXT://127.0.0.1:{broker_port}
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs={data_dir}
auto.create.topics.enable=true
num.partitions={p}
default.replication.factor=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions={p}
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions={p}
# share groups exist on 4.x only; 3.9 just warns about the unknown keys
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
# consumer groups form at once instead of after 3 s
group.initial.rebalance.delay.ms=0
num.network.threads=2
num.io.threads=2
num.recovery.threads.per.data.dir=1
# the default 128 MiB cleaner buffer does not fit a 512 MiB heap (OOM at start)
log.cleaner.dedupe.buffer.size=33554432
# snapshots of long rollouts reach 16 MiB (schemas.kafka.topics.MAX_MESSAGE_BYTES)
message.max.bytes=16777216
replica.fetch.max.bytes=16777216
"""


# ---------------------------------------------------------------- process bookkeeping

def _is_broker_process(pid: int) -> bool:
    """True if ``pid`` is alive and is a Kafka JVM (guards against recycled pids)."""
    if pid in _CHILDREN:
        return _CHILDREN[pid].poll() is None
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True  # no /proc: trust the signal test
    return state != "Z" and _BROKER_MAIN.encode() in cmdline


def _probe_client(bootstrap: str, kafka_config: str | None = None):
    from schemas.kafka.bridge import admin_client
    from schemas.kafka.security import load_kafka_config

    security = load_kafka_config(kafka_config) if kafka_config else None
    # Short reconnect backoff: the default grows to 10 s and would hide a broker that just came up.
    return admin_client(bootstrap, security=security,
                        extra={"reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 250})


def _answers(bootstrap: str, timeout: float = 2.0, client=None, kafka_config: str | None = None) -> bool:
    """True if a broker at ``bootstrap`` returns metadata naming at least one live broker."""
    from confluent_kafka import KafkaException

    from schemas.errors import TransportError
    try:
        return bool((client or _probe_client(bootstrap, kafka_config)).list_topics(timeout=timeout).brokers)
    except (KafkaException, TransportError):  # TransportError: refused while the users are still being loaded
        return False


def _read_record(state_dir: Path) -> BrokerInfo | None:
    try:
        raw = json.loads((state_dir / "broker.json").read_text())
        return BrokerInfo(**{k: raw[k] for k in _RECORD_KEYS}, kafka_config=raw.get("kafka_config"))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_record(state_dir: Path, info: BrokerInfo) -> None:
    tmp = state_dir / "broker.json.tmp"
    tmp.write_text(json.dumps({k: asdict(info)[k] for k in (*_RECORD_KEYS, "kafka_config")}, indent=2) + "\n")
    tmp.replace(state_dir / "broker.json")  # readers never see a half-written record


# ---------------------------------------------------------------- start / status / stop

def broker_status(state_dir: Path | str | None = None) -> BrokerInfo | None:
    """The broker recorded in ``state_dir`` if its process lives and it answers; else None."""
    info = _read_record(Path(state_dir) if state_dir else default_state_dir())
    if info is None or not _is_broker_process(info.pid) or not _answers(info.bootstrap,
                                                                          kafka_config=info.kafka_config):
        return None
    return info


def start_broker(state_dir: Path | str | None = None, *, partitions: int = 4, heap: str = "512m",
                 libs_dir: Path | str | None = None,
                 ready_timeout: float = READY_TIMEOUT_S,
                 properties: Mapping[str, str] | None = None, secure: bool = False) -> BrokerInfo:
    """Start (or reuse) the broker of ``state_dir``; returns once it answers metadata requests.

    ``properties`` override server.properties settings of a new broker (and of its restarts).
    ``secure``: a SASL_SSL listener, SCRAM users, mutual TLS and ACLs per role (``compose.rig.kafka.secure``;
    the client config files are in ``state_dir/secure``, the admin's is ``BrokerInfo.kafka_config``).
    A running broker is reused only if it is secured the same way.
    """
    if partitions < 1:
        raise BrokerError(f"partitions must be at least 1, got {partitions}")
    state = (Path(state_dir) if state_dir else default_state_dir()).resolve()
    old = _read_record(state)
    if old is not None and _is_broker_process(old.pid):
        # A broker that started moments ago may still be coming up: give it its chance.
        grace = max(0.0, old.started_at + ready_timeout - time.time())
        if (old.kafka_config is not None) == secure and _wait_ready(old.bootstrap, old.pid, grace, old.kafka_config):
            return replace(old, reused=True)
        stop_broker(state)
    java = find_java()
    libs = ensure_jars(libs_dir)
    version = kafka_version(libs) or "unknown"
    for _ in range(3):  # a picked port can be taken by someone else before Kafka binds it
        info = _launch(state, java, libs, version, partitions, heap, ready_timeout, properties, secure)
        if info is not None:
            return info
    raise BrokerError(f"Kafka could not bind a free loopback port (3 tries); see {state}/broker.log")


def _launch(state: Path, java: str, libs: Path, version: str, partitions: int, heap: str,
            ready_timeout: float, properties: Mapping[str, str] | None = None,
            secure: bool = False) -> BrokerInfo | None:
    """Format and run one broker; None if it lost a port race (the caller retries)."""
    data_dir = state / "data"
    shutil.rmtree(data_dir, ignore_errors=True)  # leftovers of a killed broker: ephemeral anyway
    state.mkdir(parents=True, exist_ok=True)
    broker_port, controller_port = pick_free_ports(2)
    props = state / "server.properties"
    users: list[str] = []
    kafka_config = None
    if secure:
        from compose.rig.kafka import secure as secured

        rig = secured.prepare(state)
        properties = {**secured.server_properties(rig, broker_port=broker_port, controller_port=controller_port),
                      **(properties or {})}
        users = secured.scram_format_args(rig)
        kafka_config = str(rig.config_path("admin"))
    props.write_text(render_server_properties(broker_port=broker_port, controller_port=controller_port,
                                              data_dir=data_dir, partitions=partitions, properties=properties))
    if secure:
        os.chmod(props, 0o600)  # it holds the admin's password
    try:
        fmt = subprocess.run(java_command(java, libs, version, "256m", "kafka.tools.StorageTool",
                                          "format", "-t", new_cluster_id(), "-c", str(props), *users),
                             capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as exc:
        raise BrokerError(f"formatting KRaft storage took over 120 s: {exc}") from None
    if fmt.returncode != 0:
        out = fmt.stdout + fmt.stderr
        hint = " (Kafka 4.x needs Java 17+)" if "UnsupportedClassVersionError" in out else ""
        raise BrokerError(f"formatting KRaft storage failed{hint}:\n{tail_of(out)}")
    started = time.time()
    with open(state / "broker.log", "wb") as log:
        proc = subprocess.Popen(java_command(java, libs, version, heap, _BROKER_MAIN, str(props)),
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                cwd=state, start_new_session=True)  # outlives `tokentrail kafka up`
    _CHILDREN[proc.pid] = proc
    info = BrokerInfo(pid=proc.pid, bootstrap=f"127.0.0.1:{broker_port}",
                      controller_port=controller_port, data_dir=str(data_dir),
                      kafka_version=version, started_at=started, kafka_config=kafka_config)
    _write_record(state, info)  # before waiting, so `kafka down` can stop a broker still starting
    if _wait_ready(info.bootstrap, proc.pid, ready_timeout, kafka_config):
        return replace(info, startup_s=time.time() - started)
    why = (f"exited with code {proc.returncode}" if proc.poll() is not None
           else f"did not answer at {info.bootstrap} within {ready_timeout:.0f} s")
    stop_broker(state)  # kills it if it is still up
    tail = tail_of((state / "broker.log").read_text(errors="replace"))
    if "BindException" in tail or "Address already in use" in tail:
        return None
    raise BrokerError(f"Kafka broker {why}; last lines of {state / 'broker.log'}:\n{tail}")


def fresh_broker(state_dir: Path, *, say=print) -> BrokerInfo:
    """A broker of ``state_dir`` on a fresh log (whatever ran there stopped, its data removed), jars fetched
    first if needed; ``say`` gets the line the demos print. The demos' own broker (``tokentrail demo``,
    ``demo-async``, ``demo-trl``)."""
    ensure_jars()
    stop_broker(state_dir)
    info = start_broker(state_dir)
    say(f"kafka     {info.bootstrap} (Apache Kafka {info.kafka_version}, pid {info.pid})")
    return info


def kill_broker(state_dir: Path | str) -> BrokerInfo:
    """SIGKILL the broker (a crash), keeping its data and ports for ``restart_broker``."""
    state = Path(state_dir).resolve()
    info = _read_record(state)
    if info is None or not _is_broker_process(info.pid):
        raise BrokerError(f"no running broker in {state}")
    os.kill(info.pid, signal.SIGKILL)
    proc = _CHILDREN.pop(info.pid, None)
    if proc is not None:
        proc.wait()
    else:
        _wait_gone(info.pid, STOP_TIMEOUT_S)
    return info


def restart_broker(state_dir: Path | str, *, heap: str = "512m", libs_dir: Path | str | None = None,
                   ready_timeout: float = READY_TIMEOUT_S) -> BrokerInfo:
    """Start a crashed broker again on the same ports and data (Kafka recovers its log)."""
    state = Path(state_dir).resolve()
    old = _read_record(state)
    if old is None:
        raise BrokerError(f"no broker record in {state}: start one with start_broker first")
    if _is_broker_process(old.pid):
        return replace(old, reused=True)
    java, libs = find_java(), ensure_jars(libs_dir)
    started = time.time()
    with open(state / "broker.log", "ab") as log:
        proc = subprocess.Popen(java_command(java, libs, old.kafka_version, heap, _BROKER_MAIN,
                                             str(state / "server.properties")),
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=state,
                                start_new_session=True)
    _CHILDREN[proc.pid] = proc
    info = replace(old, pid=proc.pid, started_at=started, reused=False)
    _write_record(state, info)
    if not _wait_ready(info.bootstrap, proc.pid, ready_timeout, info.kafka_config):
        raise BrokerError(f"restarted broker did not answer at {info.bootstrap}; see {state / 'broker.log'}")
    return replace(info, startup_s=time.time() - started)


def _wait_ready(bootstrap: str, pid: int, timeout: float, kafka_config: str | None = None) -> bool:
    deadline = time.monotonic() + timeout
    client = _probe_client(bootstrap, kafka_config)
    while _is_broker_process(pid):
        if _answers(bootstrap, 2.0, client):  # a shorter probe could miss a live broker
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return False


def stop_broker(state_dir: Path | str | None = None, *, timeout: float = STOP_TIMEOUT_S,
                keep_data: bool = False) -> bool:
    """Stop the broker of ``state_dir`` (SIGTERM, then SIGKILL) and remove its data.

    With ``keep_data`` the log and the broker record stay, so ``restart_broker``
    can bring the same broker (ports, topics, events) back later.
    Returns True if a live broker was stopped.
    """
    state = Path(state_dir) if state_dir else default_state_dir()
    info = _read_record(state)
    alive = info is not None and _is_broker_process(info.pid)
    if alive:
        assert info is not None  # alive implies a record
        for sig, wait_s in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
            try:
                os.kill(info.pid, sig)
            except ProcessLookupError:
                break
            if _wait_gone(info.pid, wait_s):
                break
        else:
            raise BrokerError(f"Kafka broker pid {info.pid} survived SIGKILL; check `ps {info.pid}`")
    if info is not None and (proc := _CHILDREN.pop(info.pid, None)) is not None:
        proc.wait(timeout=5)  # reap our own child
    if keep_data:
        return alive
    shutil.rmtree(state / "data", ignore_errors=True)  # never a path read from broker.json
    (state / "broker.json").unlink(missing_ok=True)
    return alive


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _is_broker_process(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


# ---------------------------------------------------------------- `tokentrail kafka`

def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="kafka_command", required=True, metavar="ACTION")
    fetch = sub.add_parser("fetch", help="lay Kafka's jars out of Maven Central; print the libs dir")
    fetch.add_argument("--libs", type=Path, help="jar dir (default: $TOKENTRAIL_KAFKA_LIBS or .kafka/libs)")
    for name, text in (("up", "start a broker (or reuse the running one); print its bootstrap"),
                       ("down", "stop the broker and remove its data"),
                       ("status", "print bootstrap and pid; exit 3 if not running")):
        sp = sub.add_parser(name, help=text, description=text)
        sp.add_argument("--dir", type=Path, help="state dir (default: $TOKENTRAIL_KAFKA_DIR or .tokentrail/kafka)")
        if name == "up":
            sp.add_argument("--partitions", type=int, default=4, help="num.partitions (default 4)")
            sp.add_argument("--heap", default="512m", help="JVM heap, e.g. 512m or 1g")
            sp.add_argument("--libs", type=Path, help="jar dir")
            sp.add_argument("--secure", action="store_true",
                            help="SASL_SSL listener, SCRAM users, mutual TLS and ACLs per role; prints the "
                                 "client config file of each role (<dir>/secure/<role>.properties)")
            sp.add_argument("--topic-prefix", default="", help="with --secure: the topic prefix the ACLs name")


def main(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except (TokentrailError, OSError) as exc:  # OSError: e.g. a state dir we may not write to
        print(f"tokentrail kafka {args.kafka_command}: {exc}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    if args.kafka_command == "fetch":
        print(ensure_jars(args.libs))
    elif args.kafka_command == "up":
        started = start_broker(args.dir, partitions=args.partitions, heap=args.heap, libs_dir=args.libs,
                               secure=args.secure)
        how = "reusing" if started.reused else f"started in {started.startup_s:.1f} s:"
        print(f"{how} Kafka {started.kafka_version} pid {started.pid}", file=sys.stderr)
        if args.secure:
            from compose.rig.kafka import secure
            from schemas.kafka.topics import topic_names

            rig = secure.SecureRig(Path(started.kafka_config or "").parent)
            secure.apply_acls(started.bootstrap, rig, secure.role_acls(topic_names(args.topic_prefix)))
            for role in secure.ROLES:
                print(f"  --kafka-config {rig.config_path(role)}   ({role})", file=sys.stderr)
        print(started.bootstrap)  # last stdout line, so BOOTSTRAP=$(tokentrail kafka up) works
    elif args.kafka_command == "down":
        print("stopped" if stop_broker(args.dir) else "not running")
    elif (info := broker_status(args.dir)) is None:
        print("not running")
        return 3
    else:
        print(f"{info.bootstrap} pid {info.pid} (Kafka {info.kafka_version})")
    return 0
