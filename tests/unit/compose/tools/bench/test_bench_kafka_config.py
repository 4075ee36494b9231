"""The benchmarks that reach a ``--bootstrap`` broker take ``--kafka-config`` for it: its settings reach every
Kafka client a benchmark makes and its path every service it starts (the stack's roles, the fold worker's
arguments and environment, the in-engine middleware's environment); a bad file exits 2 before anything starts."""

from __future__ import annotations

import argparse

import pytest

from compose.cli import build_parser
from compose.rig import scaleout as rig_scaleout
from compose.rig import stack as rig_stack
from compose.rig.stack import STACK_ROLES
from compose.tools import bench
from compose.tools.bench import _fold_worker, e2e, fold, interceptor, scaleout
from schemas.kafka.security import ENV_VAR
from tests.unit.compose.secured_config import PASSWORD, USER, assert_secured, scram_config


class _Captured(Exception):
    pass


def _raise(*_a, **_k):
    raise _Captured


def _args(name: str, *argv: str) -> argparse.Namespace:
    full = ["bench", name, *argv]
    return build_parser(full).parse_args(full)


@pytest.mark.parametrize("name", ["e2e", "interceptor", "scaleout", "fold"])
def test_a_bad_file_or_a_missing_bootstrap_exits_2_naming_it(name, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("compose.rig.kafka.broker.start_broker", _raise)  # nothing may start
    monkeypatch.setattr(fold, "workload", _raise)
    bad = tmp_path / "bad.properties"
    bad.write_text("security.protocol=SASL_SSL\nsasl.mechanism=KERBEROS\n")
    assert bench.main(_args(name, "--bootstrap", "b:1", "--kafka-config", str(bad))) == 2
    assert "sasl.mechanism='KERBEROS'" in capsys.readouterr().err
    assert bench.main(_args(name, "--kafka-config", str(scram_config(tmp_path)))) == 2
    err = capsys.readouterr().err
    assert "needs --bootstrap" in err and PASSWORD not in err


def test_e2e_hands_the_file_to_every_role_of_its_stack(tmp_path, monkeypatch):
    made: list[dict] = []

    def stack(bootstrap, run_dir, **kw):
        made.append(kw)
        raise _Captured

    monkeypatch.setattr(rig_stack, "LocalStack", stack)
    path = scram_config(tmp_path)
    with pytest.raises(_Captured):
        e2e.main(_args("e2e", "--bootstrap", "b:1", "--kafka-config", str(path)))
    assert made[0]["kafka_configs"] == {role: path.resolve() for role in STACK_ROLES}


def test_interceptor_warms_the_broker_and_runs_both_deployments_with_it(tmp_path, monkeypatch):
    path = scram_config(tmp_path)
    seen: dict[str, object] = {}
    warm = interceptor._warm_broker
    monkeypatch.setattr(interceptor, "_warm_broker", lambda *a, security=None, **k: seen.setdefault("warm", security)
                        and [])
    monkeypatch.setattr(interceptor, "_run", lambda *a: seen.setdefault("run", a[-1]))
    interceptor.main(_args("interceptor", "--bootstrap", "b:1", "--kafka-config", str(path), "--deployment", "proxy"))
    assert seen["warm"].username == USER
    assert seen["run"] == {role: path.resolve() for role in STACK_ROLES}

    configs: list[dict] = []
    monkeypatch.setattr("confluent_kafka.Producer", lambda config: configs.append(config) or _raise())
    with pytest.raises(_Captured):
        warm("b:1", 1, "t", security=seen["warm"])
    assert_secured(configs[0])


def test_interceptor_middleware_gets_the_file_in_the_engines_environment(tmp_path, monkeypatch):
    made: list[dict] = []

    def stack(bootstrap, run_dir, **kw):
        made.append(kw)
        raise _Captured

    monkeypatch.setattr(rig_stack, "LocalStack", stack)
    configs = rig_stack.one_kafka_config(scram_config(tmp_path))
    args = _args("interceptor", "--bootstrap", "b:1", "--engine", "reference")
    with pytest.raises(_Captured):
        interceptor._run(args, "middleware", "b:1", tmp_path, None, configs)
    assert made[0]["policy_env"][ENV_VAR] == str(configs["interceptor"])
    assert made[0]["kafka_configs"] == configs


def test_scaleout_runs_its_stack_and_its_own_clients_with_it(tmp_path, monkeypatch):
    path = scram_config(tmp_path)
    made: list[dict] = []
    real = rig_scaleout.ScaleRun

    def scale_run(*args, **kw):
        made.append(kw)
        raise _Captured

    monkeypatch.setattr(rig_scaleout, "ScaleRun", scale_run)
    with pytest.raises(_Captured):
        scaleout.main(_args("scaleout", "--bootstrap", "b:1", "--kafka-config", str(path)))
    configs = {role: path.resolve() for role in STACK_ROLES}
    assert made[0]["kafka_configs"] == configs
    run = real("b:1", tmp_path, rig_scaleout.ONE_WORKER, kafka_configs=configs)
    assert run.stack.kafka_configs == configs
    admin: list[dict] = []
    monkeypatch.setattr("confluent_kafka.admin.AdminClient", lambda config: admin.append(config) or _raise())
    with pytest.raises(_Captured):
        rig_scaleout.group_assignment("b:1", "g", "t", security=run.stack.security("admin"))
    assert_secured(admin[0])


def test_fold_worker_publishes_runs_and_reads_with_it(tmp_path, monkeypatch):
    path = scram_config(tmp_path)
    seen: dict[str, object] = {}
    monkeypatch.setattr(_fold_worker, "run_worker", lambda *a, kafka_config=None, **k: seen.setdefault(
        "run_worker", kafka_config) and _raise())
    with pytest.raises(_Captured):
        fold._worker(_args("fold", "--bootstrap", "b:1", "--kafka-config", str(path)), [], 1, 1.0)
    assert seen["run_worker"] == str(path)
    monkeypatch.undo()

    clients: list[dict] = []
    monkeypatch.setattr("schemas.kafka.admin.ensure_topics", lambda *a, security=None, **k: seen.setdefault(
        "topics", security))
    monkeypatch.setattr("schemas.kafka.admin.produce_all", lambda *a, **k: None)
    monkeypatch.setattr("confluent_kafka.Producer", lambda config: clients.append(config))
    monkeypatch.setattr("subprocess.Popen", lambda argv, env=None, **k: seen.setdefault("worker", (argv, env))
                        and _raise())
    monkeypatch.setenv(ENV_VAR, "/inherited/client.properties")
    with pytest.raises(_Captured):
        _fold_worker.run_worker([], {}, "b:1", tmp_path, kafka_config=path)
    assert seen["topics"].username == USER
    assert_secured(clients[0])
    argv, env = seen["worker"]
    assert argv[argv.index("--kafka-config") + 1] == str(path.resolve()) and env[ENV_VAR] == str(path.resolve())
    monkeypatch.setattr("confluent_kafka.Consumer", lambda config: clients.append(config) or _raise())
    with pytest.raises(_Captured):
        _fold_worker._drain("b:1", "t", until=1, security=seen["topics"])
    assert_secured(clients[-1])
