"""Regenerate the sanitized, trimmed request fixtures of the CLI
(``python -m compose.harnesses.gemini_cli record-fixtures tests/fixtures/gemini_cli``).

Each scenario runs the real CLI (``run_gemini_cli``) against a ``RecordingGeminiStub`` answering
from a script; every request is written, sanitized (what differs between runs and machines
replaced by fixed stand-ins: ``SANITIZED_*``) and trimmed (the ~25 KB system prompt cut to its
first ``TRIM_SYSTEM_CHARS`` characters plus a marker naming the cut), so a rerun writes the same
bytes. ``index.json`` lists every file with its route, model, turn count and tool names.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compose.harnesses import recorded_fixtures
from compose.harnesses.gemini_cli.install import GEMINI_CLI_VERSION, ensure_gemini_cli, node_executable
from compose.harnesses.gemini_cli.runner import DEFAULT_MODEL, GeminiCliResult, run_gemini_cli
from compose.harnesses.gemini_cli.stub import (
    RecordingGeminiStub,
    Reply,
    function_call,
    scripted,
    shell_call,
    text_reply,
)
from compose.harnesses.recorded_fixtures import (
    SANITIZED_HOME,
    SANITIZED_HOST,
    SANITIZED_WORKDIR,
    record_and_write,
    scratch_dirs,
    write_json,
    write_requests,
)

FIXTURE_PROMPT = "Run `echo tokentrail` with the shell tool and tell me what it printed."
FIXTURE_FINAL = "Done: the command printed tokentrail."
FIXTURE_API_KEY = "tokentrail-fixture-key"
TRIM_SYSTEM_CHARS = 400
SANITIZED_DATE = "Thursday, January 1, 2026"
SANITIZED_PGID = "4242"
SANITIZED_EPOCH_MS = "1767225600000"
SANITIZED_NODE = "v20.0.0"

#: name -> (model, scripted replies). Every scenario runs FIXTURE_PROMPT.
SCENARIOS: dict[str, tuple[str, list[Reply]]] = {
    # The canonical rollout: run_shell_command(echo tokentrail) -> functionResponse -> final text.
    "shell_two_turn": (DEFAULT_MODEL, [shell_call("echo tokentrail", call_id="call_tokentrail_01"),
                                       text_reply(FIXTURE_FINAL)]),
    # A thought chunk (dropped from history), text split over chunks (merged into one part), a call
    # with the server's id and thoughtSignature (both echoed), a call of a tool the CLI does not
    # offer and without an id (the CLI invents one, adds a placeholder signature and answers with an
    # error functionResponse), then a final answer in two chunks.
    "chunked_unknown_tool": (DEFAULT_MODEL, [
        Reply([[{"text": "I should look first.", "thought": True, "thoughtSignature": "c2lnLXRob3VnaHQ="}],
               [{"text": "Let me "}], [{"text": "check."}],
               [{"functionCall": {"id": "call_tokentrail_01", "name": "run_shell_command",
                                  "args": {"command": "echo tokentrail"}},
                 "thoughtSignature": "c2lnLXRva2VudHJhaWwtMDE="}]]),
        function_call("get_weather", {"city": "Paris"}),
        text_reply("All ", "done.", thought="Both calls answered."),
    ]),
}


class Sanitizer(recorded_fixtures.Sanitizer):
    """The shared sanitizer, plus the date, the shell's process group, the epoch in the call ids the
    CLI invents and the Node.js version; a body's system prompt is trimmed (``trim``)."""

    SUBSTITUTIONS = (
        (r"(Today's date is )[A-Z][a-z]+, [A-Z][a-z]+ \d{1,2}, \d{4}", rf"\g<1>{SANITIZED_DATE}"),
        (r"(Process Group PGID: )\d+", rf"\g<1>{SANITIZED_PGID}"),
        (r"^([a-z_]+)_\d{13}_(\d+)$", rf"\g<1>_{SANITIZED_EPOCH_MS}_\g<2>"),  # CLI-invented call ids
        (r"(gl-node/)v[0-9.]+", rf"\g<1>{SANITIZED_NODE}"),
    )

    def adjust_body(self, body: dict[str, Any]) -> None:
        trim(body)


def trim(body: dict[str, Any]) -> None:
    """Cut the system prompt's text to TRIM_SYSTEM_CHARS characters and a marker (in place)."""
    for part in (body.get("systemInstruction") or {}).get("parts") or []:
        text = part.get("text")
        if isinstance(text, str) and len(text) > TRIM_SYSTEM_CHARS:
            part["text"] = text[:TRIM_SYSTEM_CHARS] + f"...[fixture: {len(text) - TRIM_SYSTEM_CHARS} chars trimmed]"


@dataclass
class Recording:
    scenario: str
    model: str
    result: GeminiCliResult
    requests: list[dict[str, Any]]  # sanitized, trimmed RecordedRequest.as_dict()s


def record_scenario(name: str, *, entry: Path | None = None, timeout: float = 120) -> Recording:
    """Run one of SCENARIOS with the real CLI against a RecordingGeminiStub; sanitize and trim it."""
    model, replies = SCENARIOS[name]
    with scratch_dirs("tokentrail-gemini-") as (workdir, home):
        with RecordingGeminiStub(scripted(replies)) as stub:
            result = run_gemini_cli(stub.base_url, FIXTURE_PROMPT, workdir=workdir, home=home, timeout=timeout,
                                    model=model, api_key=FIXTURE_API_KEY, entry=entry)
        sanitizer = Sanitizer(workdir=workdir, home=home)
        requests = [sanitizer.request(r) for r in stub.requests]
        result.events = sanitizer.value(result.events)
    return Recording(name, model, result, requests)


def _file_name(i: int, req: dict[str, Any]) -> str:
    route = re.sub(r"[^a-z0-9]+", "_", req["path"].rsplit("/", 1)[-1].split(":")[-1].lower())
    return f"{i:02d}_{req['method'].lower()}_{route}.json"


def _summary(req: dict[str, Any]) -> dict[str, Any]:
    body = req["body"] if isinstance(req["body"], dict) else {}
    contents = body.get("contents") or []
    return {"method": req["method"], "path": req["path"], "query": req["query"], "status": req["status"],
            "contents": len(contents), "roles": [c.get("role") for c in contents],
            "tools": [d.get("name") for t in body.get("tools") or [] for d in t.get("functionDeclarations") or []],
            "generation_config": body.get("generationConfig")}


def write_fixtures(out_dir: Path, recordings: list[Recording]) -> dict[str, Any]:
    """One JSON file per request under ``out_dir/<scenario>/`` plus ``out_dir/index.json``."""
    index: dict[str, Any] = {
        "gemini_cli_version": GEMINI_CLI_VERSION,
        "regenerate": "python -m compose.harnesses.gemini_cli record-fixtures tests/fixtures/gemini_cli",
        "prompt": FIXTURE_PROMPT,
        "environment": "compose.harnesses.gemini_cli.gemini_env and OFFLINE_SETTINGS (offline, isolated HOME, "
                       "yolo, stream-json)",
        "sanitized": {"home": SANITIZED_HOME, "workdir": SANITIZED_WORKDIR, "date": SANITIZED_DATE,
                      "pgid": SANITIZED_PGID, "cli_call_id_epoch_ms": SANITIZED_EPOCH_MS,
                      "host": SANITIZED_HOST, "node": SANITIZED_NODE,
                      "content_length": "recomputed from the sanitized, trimmed body (compact_json)"},
        "trimmed": f"systemInstruction text cut to its first {TRIM_SYSTEM_CHARS} characters plus a marker",
        "body_bytes": "the CLI sends compact_json(body) exactly: JSON.stringify, no spaces, UTF-8",
        "scenarios": {},
    }
    for rec in recordings:
        names = write_requests(out_dir, rec.scenario, rec.requests, _file_name)
        files = [{"file": name, **_summary(req)} for name, req in zip(names, rec.requests, strict=True)]
        index["scenarios"][rec.scenario] = {
            "model": rec.model, "requests": files,
            "cli_tool_uses": [{k: e.get(k) for k in ("tool_name", "parameters")} for e in rec.result.tool_uses()],
            "cli_tool_results": [{k: e.get(k) for k in ("status", "output")} for e in rec.result.tool_results()],
            "cli_final_text": rec.result.final_text,
        }
    write_json(out_dir / "index.json", index)
    return index


def main(argv: list[str] | None = None) -> int:
    import argparse

    from compose.harnesses.gemini_cli.install import GeminiCliUnavailable

    parser = argparse.ArgumentParser(prog="python -m compose.harnesses.gemini_cli",
                                     description="The pinned Google Gemini CLI for tokentrail's end-to-end tests.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("install", help="install the pinned CLI into .tokentrail/gemini-cli; print its entry script")
    rec = sub.add_parser("record-fixtures", help="run SCENARIOS against the recording stub; write fixtures")
    rec.add_argument("out_dir", type=Path)
    rec.add_argument("--scenario", action="append", choices=sorted(SCENARIOS))
    args = parser.parse_args(argv)
    try:
        entry = ensure_gemini_cli()
        node_executable()
    except GeminiCliUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.cmd == "install":
        print(entry)
        return 0
    return record_and_write(
        args.out_dir, args.scenario or list(SCENARIOS), lambda name: record_scenario(name, entry=entry),
        lambda rec: None if rec.result.ok else f"the CLI failed (exit {rec.result.returncode}): {rec.result.stderr_tail}",
        write_fixtures)
