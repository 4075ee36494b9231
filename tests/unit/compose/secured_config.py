"""A SASL_SSL (SCRAM) client config file for the tests of the ``--kafka-config`` wiring of compose's commands.

What a wiring test checks: the file's settings reach a Kafka client's config (`assert_secured`), or its
path reaches a child process's arguments and environment.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["PASSWORD", "USER", "scram_config", "assert_secured"]

USER = "wiring-user"
PASSWORD = "wiring-s3cret-Pa55"


def scram_config(directory: Path, name: str = "client.properties") -> Path:
    """Write a SASL_SSL SCRAM-SHA-512 file (and its CA file) under ``directory``; its path."""
    (directory / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    path = directory / name
    path.write_text(f"security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nsasl.username={USER}\n"
                    f"sasl.password={PASSWORD}\nssl.ca.location=ca.pem\n")
    return path


def assert_secured(config: dict[str, Any]) -> None:
    """``config`` (a librdkafka client's) carries the file's settings."""
    assert config["security.protocol"] == "sasl_ssl", config
    assert (config["sasl.mechanism"], config["sasl.username"], config["sasl.password"]) == (
        "SCRAM-SHA-512", USER, PASSWORD)
