"""Kafka's runtime jars, laid out of Maven Central, and the JVM command line that runs them.

Guarantees: ``ensure_jars`` returns a directory holding a complete jar set (a set it laid out carries a
digest of the pom, so editing the pom re-resolves it; Maven writes to a staging dir renamed into place
only on success); every failure is a ``BrokerError`` whose message names what is missing and the fix.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from compose import REPO_ROOT
from schemas.errors import TokentrailError

__all__ = ["DEPENDENCY_PLUGIN", "KAFKA_CONF_DIR", "BrokerError", "default_libs_dir", "ensure_jars", "find_java",
           "java_command", "kafka_version", "tail_of"]

KAFKA_CONF_DIR = Path(__file__).resolve().parent  # pom.xml and logging configs, beside this module
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies"
_STAMP = ".pom.sha256"  # in the libs dir: digest of the pom the jars were resolved from


class BrokerError(TokentrailError):
    """The broker could not be fetched, started, found or stopped; the message says what to do."""


def default_libs_dir() -> Path:
    return Path(os.environ.get("TOKENTRAIL_KAFKA_LIBS") or REPO_ROOT / ".kafka" / "libs")


def tail_of(text: str, lines: int = 40) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def kafka_version(libs_dir: Path | str) -> str | None:
    """The Kafka version of the ``kafka_2.13-<v>.jar`` in ``libs_dir``, or None."""
    paths = sorted(Path(libs_dir).glob("kafka_2.13-*.jar")) if Path(libs_dir).is_dir() else []
    jars = [j.name for j in paths if not j.name.endswith(("-test.jar", "-sources.jar"))]
    return jars[-1][len("kafka_2.13-"):-len(".jar")] if jars else None


def ensure_jars(libs_dir: Path | str | None = None) -> Path:
    """Lay Kafka's runtime jars out in ``libs_dir`` with Maven unless they are there and current.

    A jar set we laid out carries a digest of the pom, so editing the pom re-resolves it; a
    dir named explicitly without that stamp was laid out by someone else and is trusted.
    Maven writes to a staging dir renamed into place only on success, so an interrupted
    download never passes for a complete jar set.
    """
    explicit = libs_dir is not None or bool(os.environ.get("TOKENTRAIL_KAFKA_LIBS"))
    libs = Path(libs_dir) if libs_dir else default_libs_dir()
    stamp = libs / _STAMP
    if kafka_version(libs) and (stamp.read_text().strip() == _pom_digest() if stamp.exists()
                                else explicit):
        return libs
    try:
        staging = _resolve_jars(libs)
    except BrokerError as exc:
        if not kafka_version(libs):
            raise
        print(f"warning: using the older Kafka jars in {libs}: {exc}", file=sys.stderr)
        return libs
    (staging / _STAMP).write_text(_pom_digest() + "\n")
    shutil.rmtree(libs, ignore_errors=True)
    libs.parent.mkdir(parents=True, exist_ok=True)
    try:
        staging.rename(libs)
    except OSError:  # another process put its copy in place first: keep that one
        shutil.rmtree(staging, ignore_errors=True)
    return libs


def _pom_digest() -> str:
    return hashlib.sha256((KAFKA_CONF_DIR / "pom.xml").read_bytes()).hexdigest()


def _resolve_jars(libs: Path) -> Path:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise BrokerError(
            f"mvn not found on PATH and no Kafka jars in {libs}: install Apache Maven 3.6.3+ "
            "(it lays Kafka's jars out of Maven Central), or set TOKENTRAIL_KAFKA_LIBS to a "
            "directory that holds kafka_2.13-*.jar and its dependencies")
    staging = libs.with_name(f"{libs.name}.partial-{os.getpid()}")
    errors = []
    for profile in ([], ["-Pkafka3"]):  # 4.x first; 3.9 only if 4.x cannot be resolved
        shutil.rmtree(staging, ignore_errors=True)
        cmd = [mvn, "-B", "-q", "-f", str(KAFKA_CONF_DIR / "pom.xml"), *profile, DEPENDENCY_PLUGIN,
               f"-DoutputDirectory={staging}", "-DincludeScope=runtime"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode == 0 and kafka_version(staging):
            return staging
        errors.append(f"$ {' '.join(cmd)}\n{tail_of(proc.stdout + proc.stderr, 15)}")
    shutil.rmtree(staging, ignore_errors=True)
    raise BrokerError("could not fetch Kafka's jars with Maven (is Maven Central reachable?):\n"
                      + "\n".join(errors))


def find_java() -> str:
    java = shutil.which("java")
    if java is None:
        raise BrokerError("java not found on PATH: install a JDK 17+ "
                          "(e.g. `apt-get install openjdk-17-jdk-headless`) and put `java` on PATH")
    return java


def java_command(java: str, libs: Path, version: str, heap: str, *main: str) -> list[str]:
    """The JVM command line for a Kafka main class, with the logging config for ``version``."""
    logging_opt = (f"-Dlog4j.configuration=file:{KAFKA_CONF_DIR / 'log4j.properties'}"
                   if version.startswith("3.")  # 3.9 logs through reload4j (log4j 1 syntax)
                   else f"-Dlog4j2.configurationFile={KAFKA_CONF_DIR / 'log4j2.properties'}")
    return [java, f"-Xms{heap}", f"-Xmx{heap}", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true", logging_opt, "-cp", f"{libs}/*", *main]
