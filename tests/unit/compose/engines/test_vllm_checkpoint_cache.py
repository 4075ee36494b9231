"""The checkpoint cache under concurrent engine starts: one build, every caller gets it.

The pre-warmed session engines start from threads of one process; a shared temporary
directory between two builders made one of them fail (CI, 2026-12-06). The builder here is a
stand-in script (the real one needs the engine environment), counting how often it ran.
"""

from __future__ import annotations

import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from compose.engines.vllm_rig import engine

BUILDER = """#!/bin/sh
# Stand-in for the engine environment's python: the digest query, or a slow build.
case "$2" in
  *source_digest*) echo d1gest ;;
  *) sleep 0.3; mkdir -p "$3" && echo '{}' > "$3/manifest.json" && echo built >> "{count}" ;;
esac
"""


@pytest.fixture
def fake_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    count = tmp_path / "builds"
    script = tmp_path / "python"
    script.write_text(BUILDER.replace("{count}", str(count)))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("TOKENTRAIL_VLLM_PYTHON", str(script))
    return count


def test_concurrent_starts_build_the_checkpoint_once(tmp_path: Path, fake_python: Path) -> None:
    cache = tmp_path / "cache"
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda _: engine.checkpoint("crafted", cache), range(4)))
    assert set(outs) == {cache / "d1gest" / "crafted"}
    assert (outs[0] / "manifest.json").exists()
    assert fake_python.read_text().splitlines() == ["built"]


def test_a_failed_build_says_why(tmp_path: Path, fake_python: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = Path(engine.vllm_python())
    script.write_text('#!/bin/sh\ncase "$2" in *source_digest*) echo d1gest ;; *) echo "no torch" >&2; exit 3 ;; esac\n')
    with pytest.raises(engine.EngineUnavailable, match=r"(?s)exit 3.*no torch"):
        engine.checkpoint("crafted", tmp_path / "cache")
