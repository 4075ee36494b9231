"""Regenerate the sanitized request fixtures of the CLI (``python -m compose.harnesses.claude_code record-fixtures``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compose.harnesses import recorded_fixtures
from compose.harnesses.claude_code.install import CLAUDE_CODE_VERSION, ensure_claude_code
from compose.harnesses.claude_code.runner import ClaudeCodeResult, run_claude_code
from compose.harnesses.claude_code.stub import (
    RecordingAnthropicStub,
    Reply,
    bash_tool_use,
    scripted,
    text_reply,
)
from compose.harnesses.recorded_fixtures import (
    SANITIZED_HOME,
    SANITIZED_HOST,
    SANITIZED_WORKDIR,
    compact_json,
    record_and_write,
    scratch_dirs,
    write_json,
    write_requests,
)

FIXTURE_PROMPT = "Run `echo tokentrail` with the Bash tool and tell me what it printed."
FIXTURE_ALLOWED_TOOLS = ["Bash(echo:*)"]
FIXTURE_FINAL = "Done: the command printed tokentrail."
SANITIZED_SESSION_ID = "00000000-0000-4000-8000-000000000000"
SANITIZED_DEVICE_ID = "0" * 64
SANITIZED_DATE = "2026-01-01"
SANITIZED_OS_VERSION = "Linux 6.0.0"


def _thinking(text: str, n: int) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text, "signature": f"sig-tokentrail-{n:02d}"}


#: name -> (model or None for the CLI's default, scripted replies). Every scenario runs
#: FIXTURE_PROMPT with FIXTURE_ALLOWED_TOOLS.
SCENARIOS: dict[str, tuple[str | None, list[Reply]]] = {
    # The canonical rollout: Bash(echo tokentrail) -> tool_result -> final text.
    "bash_two_turn": (None, [bash_tool_use("echo tokentrail"), text_reply(FIXTURE_FINAL)]),
    # Thinking blocks (echoed with their signatures), text before a tool call, two tool calls,
    # and a tool input whose keys the model emitted out of schema order (the CLI reorders them).
    "thinking_two_tools": (None, [
        bash_tool_use("echo one", "Print one", pre=[_thinking("I should run echo one first.", 1)]),
        bash_tool_use("echo two", "Print two", first="description",
                      pre=[_thinking("Now echo two.", 2), {"type": "text", "text": "Running the second one."}]),
        text_reply("Both commands ran: one, two.", pre=[_thinking("Both done.", 3)]),
    ]),
    # A model name the CLI does not know (what a policy server is called): other max_tokens,
    # no per-turn output_config, fewer betas.
    "custom_model": ("tokentrail-policy", [bash_tool_use("echo tokentrail"), text_reply(FIXTURE_FINAL)]),
}


def _slug(path: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "-", path)


class Sanitizer(recorded_fixtures.Sanitizer):
    """The shared sanitizer, plus the project-dir slugs of the paths, the session id, the device id,
    the date and the OS version."""

    SUBSTITUTIONS = (
        (r'("device_id":")[0-9a-f]{64}(")', rf"\g<1>{SANITIZED_DEVICE_ID}\g<2>"),
        (r"(Today's date is )\d{4}-\d{2}-\d{2}", rf"\g<1>{SANITIZED_DATE}"),
        (r"(OS Version: )[^\n]*", rf"\g<1>{SANITIZED_OS_VERSION}"),
    )

    def __init__(self, *, workdir: Path, home: Path, session_id: str | None):
        super().__init__(workdir=workdir, home=home,
                         extra=[(session_id, SANITIZED_SESSION_ID)] if session_id else [])

    def path_forms(self, real: str, fake: str) -> list[tuple[str, str]]:
        return [(real, fake), (_slug(real), _slug(fake))]


@dataclass
class Recording:
    scenario: str
    model: str | None
    result: ClaudeCodeResult
    requests: list[dict[str, Any]]  # sanitized RecordedRequest.as_dict()s


def record_scenario(name: str, *, executable: Path | None = None, timeout: float = 120) -> Recording:
    """Run one of SCENARIOS with the real CLI against a RecordingAnthropicStub; sanitize it."""
    model, replies = SCENARIOS[name]
    with scratch_dirs("tokentrail-cc-") as (workdir, home):
        with RecordingAnthropicStub(scripted(replies)) as stub:
            result = run_claude_code(stub.base_url, FIXTURE_PROMPT, workdir=workdir, home=home,
                                     timeout=timeout, model=model, allowed_tools=FIXTURE_ALLOWED_TOOLS,
                                     executable=executable)
        sanitizer = Sanitizer(workdir=workdir, home=home, session_id=result.session_id)
        requests = [sanitizer.request(r) for r in stub.requests]
        result.result = sanitizer.value(result.result)
        result.events = sanitizer.value(result.events)
    return Recording(name, model, result, requests)


def _file_name(i: int, req: dict[str, Any]) -> str:
    return f"{i:02d}_{req['method'].lower()}{re.sub(r'[^a-z0-9]+', '_', req['path'].lower())}.json"


def _summary(req: dict[str, Any]) -> dict[str, Any]:
    body = req["body"] if isinstance(req["body"], dict) else {}
    return {"method": req["method"], "path": req["path"], "query": req["query"], "model": body.get("model"),
            "stream": body.get("stream"), "messages": len(body.get("messages") or []),
            "tools": len(body.get("tools") or []), "body_bytes": len(compact_json(req["body"])),
            "status": req["status"]}


def write_fixtures(out_dir: Path, recordings: list[Recording]) -> dict[str, Any]:
    """One JSON file per request under ``out_dir/<scenario>/`` plus ``out_dir/index.json``."""
    index: dict[str, Any] = {
        "claude_code_version": CLAUDE_CODE_VERSION,
        "regenerate": "python -m compose.harnesses.claude_code record-fixtures tests/fixtures/claude_code",
        "prompt": FIXTURE_PROMPT,
        "allowed_tools": FIXTURE_ALLOWED_TOOLS,
        "environment": "compose.harnesses.claude_code.claude_code_env (offline, isolated HOME) plus "
                       "compose.harnesses.claude_code.run_claude_code's flags",
        "sanitized": {"home": SANITIZED_HOME, "workdir": SANITIZED_WORKDIR,
                      "session_id": SANITIZED_SESSION_ID, "device_id": SANITIZED_DEVICE_ID,
                      "date": SANITIZED_DATE, "os_version": SANITIZED_OS_VERSION, "host": SANITIZED_HOST,
                      "content_length": "recomputed from the sanitized body (compact_json)"},
        "body_bytes": "the CLI sends compact_json(body) exactly: JSON.stringify, no spaces, UTF-8",
        "scenarios": {},
    }
    for rec in recordings:
        names = write_requests(out_dir, rec.scenario, rec.requests, _file_name)
        files = [{"file": name, **_summary(req)} for name, req in zip(names, rec.requests, strict=True)]
        res = rec.result.result or {}
        index["scenarios"][rec.scenario] = {
            "model": rec.model or "(CLI default)",
            "requests": files,
            "cli_result": {k: res.get(k) for k in ("subtype", "is_error", "num_turns", "result", "stop_reason")},
            "cli_tool_results": rec.result.tool_results(),
        }
    write_json(out_dir / "index.json", index)
    return index


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m compose.harnesses.claude_code", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("install", help="install the pinned CLI into .tokentrail/claude-code; print its path")
    rec = sub.add_parser("record-fixtures", help="run SCENARIOS against the recording stub; write fixtures")
    rec.add_argument("out_dir", type=Path)
    rec.add_argument("--scenario", action="append", choices=sorted(SCENARIOS))
    args = parser.parse_args(argv)
    binary = ensure_claude_code()
    if args.cmd == "install":
        print(binary)
        return 0
    return record_and_write(
        args.out_dir, args.scenario or list(SCENARIOS), lambda name: record_scenario(name, executable=binary),
        lambda rec: None if rec.result.ok else f"the CLI failed: {rec.result.stderr_tail}", write_fixtures)


