"""docker-compose.yml and the Dockerfile stay consistent with the code (Docker is not run here)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

from compose.cli import SUBCOMMANDS
from schemas.kafka.topics import MAX_MESSAGE_BYTES

COMPOSE_DIR = Path(__file__).resolve().parents[3] / "compose"
REPO_ROOT = COMPOSE_DIR.parent
OUR_SERVICES = ("topics", "policy", "interceptor", "processor", "consumer")


def _with_defaults(value: str) -> str:
    """Resolve compose's ``${VAR:-default}`` the way an unset environment would."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)


@pytest.fixture(scope="module")
def services() -> dict:
    doc = yaml.safe_load((COMPOSE_DIR / "docker-compose.yml").read_text())
    return doc["services"]


def _command(service: dict) -> list[str]:
    return [_with_defaults(str(a)) for a in service.get("command", [])]


def _flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_all_services_present(services: dict) -> None:
    assert set(services) >= {"kafka", *OUR_SERVICES, "vllm"}


@pytest.mark.parametrize("name", OUR_SERVICES)
def test_service_runs_an_existing_tokentrail_subcommand(services: dict, name: str) -> None:
    cmd = _command(services[name])
    assert cmd[0] == "tokentrail", cmd
    assert cmd[1] in SUBCOMMANDS, f"{name}: `tokentrail {cmd[1]}` is not in compose.cli.SUBCOMMANDS"


@pytest.mark.parametrize("name", OUR_SERVICES)
def test_our_services_build_from_the_dockerfile(services: dict, name: str) -> None:
    build = services[name]["build"]
    assert (COMPOSE_DIR / build["context"]).resolve() == REPO_ROOT
    assert (REPO_ROOT / build["dockerfile"]).resolve() == COMPOSE_DIR / "Dockerfile"


def test_bootstrap_flags_name_the_kafka_listener(services: dict) -> None:
    advertised = services["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    internal = re.search(r"PLAINTEXT://([^,]+)", advertised).group(1)
    for name in OUR_SERVICES:
        cmd = _command(services[name])
        if "--bootstrap" in cmd:
            assert _flag(cmd, "--bootstrap") == internal, name
            assert "kafka" in services[name]["depends_on"] or "topics" in services[name]["depends_on"]


def test_kafka_is_single_node_kraft_and_takes_16_mib_messages(services: dict) -> None:
    env = services["kafka"]["environment"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == f"{env['KAFKA_NODE_ID']}@kafka:9093"
    assert str(env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"]).lower() == "true"
    assert int(env["KAFKA_MESSAGE_MAX_BYTES"]) >= MAX_MESSAGE_BYTES
    assert int(env["KAFKA_REPLICA_FETCH_MAX_BYTES"]) >= MAX_MESSAGE_BYTES
    assert services["kafka"]["image"].startswith("apache/kafka:")


def test_pipeline_waits_for_topics(services: dict) -> None:
    assert services["topics"]["depends_on"]["kafka"]["condition"] == "service_healthy"
    for name in ("interceptor", "processor", "consumer"):
        assert services[name]["depends_on"]["topics"]["condition"] == "service_completed_successfully"


def test_interceptor_upstream_is_switchable(services: dict) -> None:
    raw = services["interceptor"]["command"]
    upstream = raw[raw.index("--upstream") + 1]
    assert upstream.startswith("${TOKENTRAIL_UPSTREAM:-"), "the upstream must come from an env var"
    default = _with_defaults(upstream)
    policy_port = _flag(_command(services["policy"]), "--port")
    assert default == f"http://policy:{policy_port}"
    vllm_port = _flag(_command(services["vllm"]), "--port")
    assert f"http://vllm:{vllm_port}" in (COMPOSE_DIR / "docker-compose.yml").read_text()


def test_vllm_is_optional_gpu_service_in_both_deployments(services: dict) -> None:
    proxy, inengine = services["vllm"], services["vllm-inengine"]
    assert proxy["profiles"] == ["gpu"] and inengine["profiles"] == ["gpu-inengine"]
    assert proxy["image"] == "vllm/vllm-openai:v0.33.0"
    assert "FROM vllm/vllm-openai:v0.33.0" in (COMPOSE_DIR / "Dockerfile.vllm").read_text()
    assert _flag(_command(inengine), "--middleware") == "producers.middleware.TokentrailMiddleware"
    assert _flag(_command(inengine), "--api-server-count") == "1"
    assert inengine["environment"]["TOKENTRAIL_BOOTSTRAP"] == "kafka:9092"
    for service in (proxy, inengine):  # the flags tokentrail needs come from one file, mounted in both
        assert _flag(_command(service), "--config") == "/etc/tokentrail/serve.yaml"
        assert "./engines/vllm_rig/serve.yaml:/etc/tokentrail/serve.yaml:ro" in service["volumes"]
    flags = yaml.safe_load((COMPOSE_DIR / "engines" / "vllm_rig" / "serve.yaml").read_text())
    assert flags["enable-auto-tool-choice"] is True and flags["tool-call-parser"] == "hermes"
    assert flags["reasoning-parser"] and flags["logprobs-mode"] in ("raw_logprobs", "processed_logprobs")
    assert flags["enable-scale-out"] is True
    assert "profiles" not in services["kafka"] and "profiles" not in services["interceptor"]


def test_dockerfile_installs_the_project() -> None:
    text = (COMPOSE_DIR / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim\b", text, re.M)
    assert re.search(r"^RUN pip install \.", text, re.M)
    copied = {src for line in re.findall(r"^COPY (.+)$", text, re.M) for src in line.split()[:-1]}
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert project["readme"] in copied, "the readme pyproject names must be in the image"
    for package in ("schemas", "producers", "processors", "consumers", "compose"):
        assert package in copied and (REPO_ROOT / package).is_dir(), package
