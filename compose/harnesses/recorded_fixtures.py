"""What the request-fixture recorders of the CLIs (``compose.harnesses.claude_code.fixtures``,
``compose.harnesses.gemini_cli.fixtures``) share: the sanitizer, the CLI's body bytes, the scratch
directories a scenario runs in, writing one scenario's request files, and ``record-fixtures``'
record-then-write loop.

Guarantees: a ``Sanitizer`` replaces every form of the run's home and working directory (as given
and resolved, longest first, so a home inside the workdir's parent is replaced before that parent)
and then the harness's own ``SUBSTITUTIONS``, in order, in every string of a recorded request; a
``host`` or ``content-length`` header is replaced only where the CLI sent one, ``content-length``
recomputed from the sanitized body (after ``adjust_body``), so a fixture's length matches its bytes.
Each harness keeps only its own substitutions and stand-ins.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

SANITIZED_HOME = "/home/tokentrail"
SANITIZED_WORKDIR = "/work/rollout"
SANITIZED_HOST = "127.0.0.1:8080"


class Recorded(Protocol):
    """A stub's record of one request (``compose.harnesses.stub_server.RecordedRequest``)."""

    def as_dict(self) -> dict[str, Any]: ...


def compact_json(body: Any) -> bytes:
    """The body as the CLI serializes it (JSON.stringify: no spaces, UTF-8, no ASCII escaping)."""
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


class Sanitizer:
    """Replaces what differs between runs and machines with fixed stand-ins (``SANITIZED_*``).

    A harness subclasses it with its ``SUBSTITUTIONS`` (``(pattern, replacement)`` for ``re.sub``,
    applied after the path pairs), and may add pairs of its own (``extra``), more forms of each
    path (``path_forms``) or change a body before its length is taken (``adjust_body``).
    """

    SUBSTITUTIONS: ClassVar[tuple[tuple[str, str], ...]] = ()

    def __init__(self, *, workdir: Path, home: Path, extra: Iterable[tuple[str, str]] = ()) -> None:
        self.pairs: list[tuple[str, str]] = []
        for real, fake in ((home, SANITIZED_HOME), (workdir, SANITIZED_WORKDIR)):
            for form in {str(real), str(real.resolve())}:
                self.pairs.extend(self.path_forms(form, fake))
        self.pairs.extend(extra)
        self.pairs.sort(key=lambda p: -len(p[0]))  # longest first: home before its parent dirs

    def path_forms(self, real: str, fake: str) -> list[tuple[str, str]]:
        """The pairs one form of a path gives (by default the path itself)."""
        return [(real, fake)]

    def text(self, s: str) -> str:
        for real, fake in self.pairs:
            s = s.replace(real, fake)
        for pattern, replacement in self.SUBSTITUTIONS:
            s = re.sub(pattern, replacement, s)
        return s

    def value(self, v: Any) -> Any:
        if isinstance(v, str):
            return self.text(v)
        if isinstance(v, list):
            return [self.value(x) for x in v]
        if isinstance(v, dict):
            return {k: self.value(x) for k, x in v.items()}
        return v

    def adjust_body(self, body: dict[str, Any]) -> None:
        """Change a sanitized JSON body in place before its length is taken (by default nothing)."""

    def request(self, r: Recorded) -> dict[str, Any]:
        out = self.value(r.as_dict())
        headers = out["headers"]
        if "host" in headers:
            headers["host"] = SANITIZED_HOST
        if isinstance(out["body"], dict):
            self.adjust_body(out["body"])
            if "content-length" in headers:
                headers["content-length"] = str(len(compact_json(out["body"])))
        return out


@contextlib.contextmanager
def scratch_dirs(prefix: str) -> Iterator[tuple[Path, Path]]:
    """A fresh ``(workdir, home)`` pair in a temporary directory, removed on exit."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        workdir, home = Path(tmp) / "rollout", Path(tmp) / "home"
        workdir.mkdir()
        home.mkdir()
        yield workdir, home


def write_requests(out_dir: Path, scenario: str, requests: list[dict[str, Any]],
                   file_name: Callable[[int, dict[str, Any]], str]) -> list[str]:
    """Write each request as ``out_dir/<scenario>/<file_name(i, request)>`` (the folder emptied
    first); return the paths relative to ``out_dir``."""
    sdir = out_dir / scenario
    if sdir.exists():
        shutil.rmtree(sdir)
    sdir.mkdir(parents=True)
    files = []
    for i, req in enumerate(requests):
        fname = file_name(i, req)
        write_json(sdir / fname, req)
        files.append(f"{scenario}/{fname}")
    return files


class Recording(Protocol):
    """A harness's recording of one scenario: the sanitized requests."""

    requests: list[dict[str, Any]]


R = TypeVar("R", bound=Recording)


def record_and_write(out_dir: Path, names: Iterable[str], record: Callable[[str], R],
                     failure: Callable[[R], str | None], write: Callable[[Path, list[R]], Any]) -> int:
    """``record`` each scenario, then ``write`` them all into ``out_dir``; the exit status of
    ``record-fixtures``. The first scenario ``failure`` names (the CLI failed) is printed to stderr
    and nothing is written (1)."""
    recordings = []
    for name in names:
        recording = record(name)
        why = failure(recording)
        if why is not None:
            print(f"{name}: {why}", file=sys.stderr)
            return 1
        recordings.append(recording)
    out_dir.mkdir(parents=True, exist_ok=True)
    write(out_dir, recordings)
    print(f"wrote {sum(len(r.requests) for r in recordings)} requests to {out_dir}")
    return 0


def write_json(path: Path, value: Any) -> None:
    """``value`` as a fixture file: indent 1, UTF-8 as is, a final newline."""
    path.write_text(json.dumps(value, indent=1, ensure_ascii=False) + "\n")


__all__ = ["SANITIZED_HOME", "SANITIZED_HOST", "SANITIZED_WORKDIR", "Recorded", "Recording", "Sanitizer",
           "compact_json", "record_and_write", "scratch_dirs", "write_json", "write_requests"]
