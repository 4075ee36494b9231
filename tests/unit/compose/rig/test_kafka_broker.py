"""The jar-broker launcher without a broker: config rendering, ports, ids, records, CLI errors."""

from __future__ import annotations

import base64
import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from compose import cli
from compose.rig.kafka import broker as kafka_broker
from compose.rig.kafka.broker import (
    BrokerError,
    broker_status,
    ensure_jars,
    java_command,
    kafka_version,
    new_cluster_id,
    pick_free_ports,
    render_server_properties,
    stop_broker,
)


def _parse_properties(text: str) -> dict[str, str]:
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    return dict(ln.split("=", 1) for ln in lines)


def _run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _write_record(state: Path, pid: int, bootstrap: str = "127.0.0.1:1") -> None:
    state.mkdir(parents=True, exist_ok=True)
    (state / "data").mkdir()
    (state / "broker.json").write_text(json.dumps({
        "pid": pid, "bootstrap": bootstrap, "controller_port": 2, "data_dir": str(state / "data"),
        "kafka_version": "4.3.1", "started_at": 0.0}))


# ---------------------------------------------------------------- configuration

def test_server_properties_single_node_kraft(tmp_path: Path) -> None:
    props = _parse_properties(render_server_properties(
        broker_port=40001, controller_port=40002, data_dir=tmp_path / "data", partitions=6))
    assert props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"] == f"{props['node.id']}@127.0.0.1:40002"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:40001,CONTROLLER://127.0.0.1:40002"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:40001"
    assert props["controller.listener.names"] == "CONTROLLER"
    assert props["log.dirs"] == str(tmp_path / "data")
    assert props["num.partitions"] == "6"
    assert props["auto.create.topics.enable"] == "true"
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert props["log.cleaner.dedupe.buffer.size"] == "33554432"
    for key in ("default.replication.factor", "offsets.topic.replication.factor",
                "transaction.state.log.replication.factor", "transaction.state.log.min.isr"):
        assert props[key] == "1", key


def test_server_properties_allow_16_mib_messages(tmp_path: Path) -> None:
    from schemas.kafka.topics import MAX_MESSAGE_BYTES

    props = _parse_properties(render_server_properties(
        broker_port=1, controller_port=2, data_dir=tmp_path))
    assert int(props["message.max.bytes"]) >= MAX_MESSAGE_BYTES
    assert int(props["replica.fetch.max.bytes"]) >= MAX_MESSAGE_BYTES


def test_picked_ports_are_distinct_and_bindable() -> None:
    ports = pick_free_ports(2)
    assert len(set(ports)) == 2
    for port in ports:
        assert 0 < port < 65536
        with socket.socket() as s:  # still free: it can be bound again
            s.bind(("127.0.0.1", port))


def test_cluster_id_is_22_char_base64url_of_16_bytes() -> None:
    cid = new_cluster_id()
    assert len(cid) == 22 and "=" not in cid
    assert set(cid) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    assert len(base64.urlsafe_b64decode(cid + "==")) == 16
    assert new_cluster_id() != cid


def test_cluster_id_never_starts_with_a_dash(monkeypatch) -> None:
    # StorageTool would parse "-t -abc..." as an option; 0xf8.. bytes encode to a leading "-".
    draws = iter([bytes([0xF8]) + bytes(15), bytes(16)])
    monkeypatch.setattr(kafka_broker.uuid, "uuid4", lambda: type("U", (), {"bytes": next(draws)})())
    assert new_cluster_id() == "AAAAAAAAAAAAAAAAAAAAAA"


def test_kafka_version_from_jar_names(tmp_path: Path) -> None:
    assert kafka_version(tmp_path / "missing") is None
    assert kafka_version(tmp_path) is None
    (tmp_path / "kafka_2.13-4.3.1.jar").touch()
    (tmp_path / "kafka-clients-4.3.1.jar").touch()
    assert kafka_version(tmp_path) == "4.3.1"


def test_java_command_picks_the_logging_config_per_major_version(tmp_path: Path) -> None:
    v4 = java_command("java", tmp_path, "4.3.1", "512m", "kafka.Kafka", "p")
    v3 = java_command("java", tmp_path, "3.9.1", "512m", "kafka.Kafka", "p")
    assert any(a.startswith("-Dlog4j2.configurationFile=") for a in v4)
    assert any(a.startswith("-Dlog4j.configuration=file:") for a in v3)
    assert v4[v4.index("-cp") + 1] == f"{tmp_path}/*"  # one quoted wildcard, expanded by java
    assert v4[-2:] == ["kafka.Kafka", "p"]
    for arg in v4 + v3:  # the referenced config files ship with the package
        if arg.startswith(("-Dlog4j2.configurationFile=", "-Dlog4j.configuration=file:")):
            assert Path(arg.split("=", 1)[1].removeprefix("file:")).is_file()


# ---------------------------------------------------------------- status / stop records

def test_status_none_without_record(tmp_path: Path) -> None:
    assert broker_status(tmp_path) is None


def test_status_none_for_stale_record_with_dead_pid(tmp_path: Path) -> None:
    _write_record(tmp_path, _dead_pid())
    assert broker_status(tmp_path) is None


def test_status_none_when_pid_is_not_a_kafka_jvm(tmp_path: Path) -> None:
    # A recycled pid (here: our own) must not pass for the broker.
    _write_record(tmp_path, os.getpid())
    assert broker_status(tmp_path) is None


def test_status_none_for_corrupt_record(tmp_path: Path) -> None:
    (tmp_path / "broker.json").write_text("{not json")
    assert broker_status(tmp_path) is None


def test_stop_with_stale_record_cleans_up_and_signals_nothing(tmp_path: Path) -> None:
    _write_record(tmp_path, os.getpid())  # would be fatal if it were signalled
    assert stop_broker(tmp_path) is False
    assert not (tmp_path / "broker.json").exists()
    assert not (tmp_path / "data").exists()


# ---------------------------------------------------------------- jars

def _fake_mvn(bin_dir: Path, *, fail_kafka4: bool) -> None:
    """A `mvn` that lays out a fake jar set, failing for 4.x if asked (no network needed)."""
    script = bin_dir / "mvn"
    script.write_text(f"""#!{sys.executable}
import sys, pathlib
args = sys.argv[1:]
out = pathlib.Path(next(a for a in args if a.startswith("-DoutputDirectory="))
                   .split("=", 1)[1])
kafka3 = "-Pkafka3" in args
if {fail_kafka4!r} and not kafka3:
    print("Could not resolve org.apache.kafka:kafka_2.13:4.3.1"); sys.exit(1)
out.mkdir(parents=True)
(out / ("kafka_2.13-3.9.1.jar" if kafka3 else "kafka_2.13-4.3.1.jar")).touch()
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


@pytest.mark.parametrize(("fail_kafka4", "version"), [(False, "4.3.1"), (True, "3.9.1")])
def test_ensure_jars_resolves_and_falls_back_to_kafka3(tmp_path: Path, monkeypatch,
                                                       fail_kafka4: bool, version: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_mvn(bin_dir, fail_kafka4=fail_kafka4)
    monkeypatch.setenv("PATH", str(bin_dir))
    libs = ensure_jars(tmp_path / "libs")
    assert libs == tmp_path / "libs"
    assert kafka_version(libs) == version
    assert not list(tmp_path.glob("libs.partial-*"))  # staging dir renamed into place


def test_ensure_jars_without_mvn_names_the_fix(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on PATH
    with pytest.raises(BrokerError, match="mvn not found on PATH.*install Apache Maven"):
        ensure_jars(tmp_path / "libs")


def test_ensure_jars_trusts_an_explicit_unstamped_jar_dir(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # would fail if it tried Maven
    (tmp_path / "kafka_2.13-4.3.1.jar").touch()
    assert ensure_jars(tmp_path) == tmp_path


# ---------------------------------------------------------------- CLI

def test_cli_up_without_java_names_the_fix(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(kafka_broker.shutil, "which", lambda name, *a, **k: None)
    rc, out, err = _run_cli(["kafka", "up", "--dir", str(tmp_path / "k")], capsys)
    assert rc != 0
    assert "java not found on PATH: install a JDK 17+" in err
    assert "Traceback" not in err and out == ""


def test_cli_fetch_without_mvn_names_the_fix(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    rc, _, err = _run_cli(["kafka", "fetch", "--libs", str(tmp_path / "libs")], capsys)
    assert rc == 1
    assert "mvn not found on PATH" in err and "Traceback" not in err


def test_cli_status_not_running_exits_3(tmp_path: Path, capsys) -> None:
    rc, out, _ = _run_cli(["kafka", "status", "--dir", str(tmp_path)], capsys)
    assert rc == 3
    assert out.strip() == "not running"


def test_cli_down_when_nothing_runs(tmp_path: Path, capsys) -> None:
    rc, out, _ = _run_cli(["kafka", "down", "--dir", str(tmp_path)], capsys)
    assert rc == 0
    assert out.strip() == "not running"


def test_cli_subcommand_is_registered() -> None:
    assert cli.SUBCOMMANDS["kafka"][0] == "compose.rig.kafka.broker"
    assert cli.SUBCOMMANDS["topics"][0] == "compose.ops.topics"


def _fake_java(bin_dir: Path) -> None:
    """A `java` whose StorageTool succeeds and whose kafka.Kafka never becomes ready."""
    script = bin_dir / "java"
    script.write_text(f"""#!{sys.executable}
import sys, time
if "kafka.tools.StorageTool" in sys.argv:
    sys.exit(0)
print("fake broker: stuck before listening", flush=True)
time.sleep(600)
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


def test_broker_not_ready_is_killed_and_reported_with_its_log(tmp_path: Path, monkeypatch) -> None:
    bin_dir, libs, state = tmp_path / "bin", tmp_path / "libs", tmp_path / "state"
    bin_dir.mkdir()
    libs.mkdir()
    (libs / "kafka_2.13-4.3.1.jar").touch()
    _fake_java(bin_dir)
    monkeypatch.setenv("PATH", str(bin_dir))
    before = set(kafka_broker._CHILDREN)  # the session's broker may be one of them
    with pytest.raises(BrokerError, match=r"(?s)did not answer at 127\.0\.0\.1:\d+ within 1 s.*"
                                          r"fake broker: stuck before listening"):
        kafka_broker.start_broker(state, libs_dir=libs, ready_timeout=1.0)
    assert not (state / "broker.json").exists()
    assert set(kafka_broker._CHILDREN) == before  # the stuck one was killed and reaped


def test_start_rejects_zero_partitions(tmp_path: Path) -> None:
    with pytest.raises(BrokerError, match="partitions must be at least 1"):
        kafka_broker.start_broker(tmp_path, partitions=0)


def test_server_properties_take_overrides_after_the_defaults(tmp_path: Path) -> None:
    text = render_server_properties(broker_port=1, controller_port=2, data_dir=tmp_path,
                                    properties={"broker.session.timeout.ms": "3000", "num.io.threads": "1"})
    props = _parse_properties(text)  # Kafka, like this parser, keeps the last value of a key
    assert props["broker.session.timeout.ms"] == "3000" and props["num.io.threads"] == "1"
    assert text.index("num.io.threads=2") < text.index("num.io.threads=1")
