"""The vLLM middleware's settings, from the environment, and its per-process spool (see ``producers.middleware``).

vLLM constructs middleware with the app only, so every setting comes from one
environment variable (``ENV_SETTINGS``, one line each); an unset or empty variable
keeps the default, and an invalid one raises ``ConfigError`` naming the variable.
``claim_spool_dir`` gives each API server process a spool of its own under
``TOKENTRAIL_SPOOL_DIR``.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from producers.capture.spool import Spool
from producers.settings import InterceptorSettings
from schemas.errors import ConfigError, DurabilityError
from schemas.kafka.topics import topic_names

__all__ = ["ENV_SETTINGS", "claim_spool_dir", "settings_from_env"]

log = logging.getLogger("tokentrail.interceptor")
IN_PROCESS = "http://in-process"


def _flag(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected 1 or 0")


def _json(raw: str) -> Any:
    return json.loads(raw)


# One line per variable: (environment name, InterceptorSettings field, parser).
# An unset or empty variable leaves the field at its default.
ENV_SETTINGS: tuple[tuple[str, str, Callable[[str], Any]], ...] = (
    ("TOKENTRAIL_BOOTSTRAP", "bootstrap", str),  # required
    ("TOKENTRAIL_KAFKA_CONFIG", "kafka", str),  # Kafka client config file: TLS, SASL (schemas.kafka.security)
    ("TOKENTRAIL_SPOOL_DIR", "spool_dir", str),  # parent of the per-process spools
    ("TOKENTRAIL_CONTROL_TOKEN", "control_token", str),
    ("TOKENTRAIL_SAMPLING", "sampling_overrides", _json),  # JSON object
    ("TOKENTRAIL_TOPIC_PREFIX", "topics", topic_names),
    ("TOKENTRAIL_PREFIX_SUPPLY", "prefix_supply", _flag),  # 1/0
    ("TOKENTRAIL_DELTA_RECORDS", "delta_records", _flag),  # 1/0
    ("TOKENTRAIL_UPSTREAM_MODEL", "upstream_model", str),  # a name vLLM serves (--served-model-name)
    ("TOKENTRAIL_UPSTREAM_API_KEY", "upstream_api_key", str),  # vLLM's --api-key, sent as Bearer
    ("TOKENTRAIL_LOGPROBS_MODE", "logprobs_mode", str),  # as vLLM's --logprobs-mode
    ("TOKENTRAIL_ROLLOUT_SECRET", "rollout_secret", str),  # rollout tokens required under /ng-rollout/
    ("TOKENTRAIL_MAX_BODY_BYTES", "max_body_bytes", int),  # request body limit (413 above it)
    ("TOKENTRAIL_ENGINE_TIMEOUT_S", "engine_timeout_s", float),  # seconds, > 0
    ("TOKENTRAIL_STREAM_IDLE_TIMEOUT_S", "stream_idle_timeout_s", float),  # seconds, > 0
    ("TOKENTRAIL_ABORT_POLICY", "abort_policy", str),  # mask or continue
    ("TOKENTRAIL_FOLLOW_VERSIONS", "follow_versions", _flag),  # 1/0 (default 1: follow the versions topic)
)
_ENV_OF = {field: name for name, field, _ in ENV_SETTINGS}


def settings_from_env(env: dict[str, str] | None = None) -> InterceptorSettings:
    env = dict(os.environ if env is None else env)
    if not env.get("TOKENTRAIL_BOOTSTRAP"):
        raise ConfigError("TOKENTRAIL_BOOTSTRAP is not set: the middleware needs the Kafka bootstrap servers (host:port)")
    values: dict[str, Any] = {"upstream_url": IN_PROCESS, "follow_versions": True}
    for name, field, parse in ENV_SETTINGS:
        raw = env.get(name)
        if not raw:
            continue
        try:
            values[field] = parse(raw)
        except ValueError as exc:  # bad JSON, a flag that is not 1/0 (the value is not echoed: it may be a secret)
            raise ConfigError(f"invalid {name} for the vLLM middleware: {exc}") from exc
    try:
        return InterceptorSettings(**values)
    except ValueError as exc:  # pydantic's ValidationError
        names = sorted({_ENV_OF.get(str(e["loc"][0]), str(e["loc"][0])) for e in exc.errors() if e.get("loc")})  # type: ignore[attr-defined]
        raise ConfigError(f"invalid TOKENTRAIL_* settings for the vLLM middleware ({', '.join(names)}): {exc}") from exc


# -- per-process spools ----------------------------------------------------------------------

_SLOT = re.compile(r"^api-(\d+)$")


def claim_spool_dir(parent: Path, skip: frozenset[Path] = frozenset()) -> Path:
    """The spool directory this process should use under ``parent`` (see the module docstring).

    Candidates are probed by opening them (which takes and then releases the spool's
    flock): one held by a live process is skipped, the first with undrained events wins,
    else the first free empty one, else a new ``api-<k>``. A spool written directly in
    ``parent`` by an older single-process version counts as a candidate too.
    """
    parent.mkdir(parents=True, exist_ok=True)
    slots = sorted((int(m[1]), p) for p in parent.iterdir() if p.is_dir() and (m := _SLOT.match(p.name)))
    candidates = ([parent] if (parent / "spool.log").exists() else []) + [p for _, p in slots]
    free: Path | None = None
    for directory in candidates:
        if directory in skip:
            continue
        try:
            spool = Spool(directory)
        except DurabilityError:  # held by a live process
            continue
        pending = len(spool)
        spool.close()
        if pending:
            log.warning("spool %s holds %d event(s) of a process that is gone; this process drains them first",
                        directory, pending)
            return directory
        if free is None and directory != parent:
            free = directory
    if free is not None:
        return free
    taken = {k for k, _ in slots}
    return parent / f"api-{next(k for k in range(len(taken) + 1) if k not in taken)}"
