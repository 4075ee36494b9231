"""The production engine's wire contract, read from its wheel: what tokentrail sends and the stand-in answers are
checked against it without vLLM installed.

``vllm-<version>.json`` (checked in) describes one vLLM release's request and response models;
``generate`` writes it from the release's wheel (``python -m compose.engines.vllm_contract.generate
--wheel 0.34.0``), ``check`` validates JSON values against it, ``load`` reads it. The live
contract test (``tests/integration/compose/engines/test_engine_contract.py``) pins the stand-in
to the vLLM build that runs here (0.32, CPU); this one pins both the interceptor's requests and
the stand-in's answers to the production target, which cannot run here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from schemas.errors import TokentrailError

CONTRACT_DIR = Path(__file__).resolve().parent
FORMAT = 1  # of the description file; a reader refuses another
PRODUCTION = "0.34.0"  # the vLLM release tokentrail targets in production


class ContractFileError(TokentrailError):
    """The description file is missing, unreadable or of another format."""


def load(version: str = PRODUCTION, directory: Path = CONTRACT_DIR) -> dict[str, Any]:
    """The description of vLLM ``version`` (``vllm-<version>.json``)."""
    path = directory / f"vllm-{version}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ContractFileError(f"{path}: cannot read the vLLM {version} description ({exc}); regenerate it with "
                                f"python -m compose.engines.vllm_contract.generate --wheel {version}") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ContractFileError(f"{path}: format {data.get('format') if isinstance(data, dict) else None!r}, this "
                                f"reader knows {FORMAT}; regenerate it with the generator of this checkout")
    return data
