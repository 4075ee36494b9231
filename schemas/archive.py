"""Archive the current writer schemas: ``python -m schemas.archive``.

Readers must keep every writer schema they accept (ARCHITECTURE §4). Run this
after changing an ``.avsc`` file; ``tests/unit/schemas/test_codec.py`` fails
until the current canonical form of every top-level schema is archived here.
"""

from __future__ import annotations

import json
from importlib import resources

from fastavro.schema import load_schema, to_parsing_canonical_form

from schemas.codec import _fingerprint_of

TOP_LEVEL = ("RolloutEvent", "Snapshot", "RebuiltRollout", "RolloutHeader", "StoredCall", "FingerprintIndex", "StoredIncomplete",
             "PolicyVersion")


def archive() -> list[str]:
    """Write each top-level schema's canonical form to history/<name>.<fingerprint>.json."""
    written = []
    base = resources.files("schemas") / "avro"
    for name in TOP_LEVEL:
        with resources.as_file(base / f"tokentrail.{name}.avsc") as path:
            parsed = load_schema(str(path))
        target = base / "history" / f"{name}.{_fingerprint_of(parsed).hex()}.json"
        with resources.as_file(target) as out:
            if not out.exists():
                out.write_text(json.dumps(json.loads(to_parsing_canonical_form(parsed)), indent=1) + "\n")
                written.append(out.name)
    return written


if __name__ == "__main__":
    for name in archive():
        print(f"archived {name}")
