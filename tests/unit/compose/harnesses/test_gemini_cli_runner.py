"""The Gemini CLI runner: pins, install, Node.js check, settings, argv, environment, event parsing,
timeout and kill, and the real CLI against the recording stub.

Most tests run a stub "node" in place of Node.js (it answers ``--version``, then records its argv,
environment, working directory and the generated ``settings.json`` and prints scripted
stream-json events, fails, hangs or leaves processes behind). The tests marked "real CLI" install
the pinned CLI on first use (``ensure_gemini_cli``: ``npm ci`` into ``.tokentrail/gemini-cli``) and
are skipped, with the reason, only when that is impossible here (no npm or Node.js >= 20, or the
registry unreachable).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from compose.harnesses import gemini_cli as gc
from compose.harnesses import npm
from compose.harnesses.gemini_cli import fixtures as gfx
from tests.unit.compose.harnesses.harness_cli_helpers import (
    check_no_process_outlives_a_normal_exit,
    check_pin_files,
    check_real_cli_killed_at_the_timeout,
    check_the_timeout_kills_the_tree,
    fake_npm_ci,
    forbid_npm,
    installed_or_skip,
    needs_proc,
    python_script,
    run_fake_cli,
    sleepers_source,
)

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "gemini_cli"
BASE = "http://127.0.0.1:9/ng-rollout/r-1/training-token-capture"

# --------------------------------------------------------------------------- pins and install


def test_the_three_pins_agree() -> None:
    entry, lock = check_pin_files(gc.PIN_DIR, gc.GEMINI_CLI_PACKAGE, gc.GEMINI_CLI_VERSION)
    assert entry["bin"] == {"gemini": "bundle/gemini.js"} and "hasInstallScript" not in entry
    assert entry["engines"] == {"node": f">={gc.install.NODE_MAJOR}"}
    # Every package is pinned with the registry's hash; only optional ones have install scripts
    # (which --ignore-scripts never runs).
    for key, pkg in lock["packages"].items():
        if key:
            assert pkg["integrity"].startswith("sha512-"), key
            assert "hasInstallScript" not in pkg or pkg.get("optional"), key


def _fake_install(root: Path, version: str = gc.GEMINI_CLI_VERSION) -> Path:
    package = gc.install_dir(root) / "node_modules" / gc.GEMINI_CLI_PACKAGE
    (package / "bundle").mkdir(parents=True)
    (package / "package.json").write_text(json.dumps({"version": version}))
    entry = gc.entry_path(root)
    entry.write_text("// the bundle\n")
    return entry


def test_ensure_is_idempotent_without_starting_npm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entry = _fake_install(tmp_path)
    forbid_npm(monkeypatch, "ensure_gemini_cli")
    assert gc.ensure_gemini_cli(tmp_path) == entry == tmp_path / ".tokentrail/gemini-cli/node_modules/" \
        "@google/gemini-cli/bundle/gemini.js"
    assert gc.installed_version(tmp_path) == gc.GEMINI_CLI_VERSION


def test_ensure_reinstalls_another_version_and_names_the_fix_without_npm(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_install(tmp_path, version="0.1.0")
    monkeypatch.setattr(npm.shutil, "which", lambda name: None)
    with pytest.raises(gc.GeminiCliUnavailable,
                       match="npm is not on PATH.*Node.js >= 20.*python -m compose.harnesses.gemini_cli install"):
        gc.ensure_gemini_cli(tmp_path)


def test_ensure_runs_npm_ci_from_the_pin_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_npm_ci(monkeypatch, lambda: _fake_install(tmp_path))
    target = gc.install_dir(tmp_path)
    target.mkdir(parents=True)
    assert gc.ensure_gemini_cli(tmp_path) == gc.entry_path(tmp_path)
    (argv, cwd), = calls
    assert cwd == target and argv[:3] == ["/usr/bin/npm", "ci", "--ignore-scripts"]
    assert (target / "package-lock.json").read_text() == (gc.PIN_DIR / "package-lock.json").read_text()


@pytest.mark.parametrize("version", ["v18.19.0", "v8.0.0", "not a version", ""])
def test_an_old_or_strange_node_is_refused_naming_the_fix(tmp_path: Path, version: str) -> None:
    node = python_script(tmp_path / "node", f"print({version!r})")
    with pytest.raises(gc.GeminiCliUnavailable, match=r"needs Node.js >= 20: install a newer Node.js"):
        gc.node_executable(str(node))


def test_a_missing_node_is_refused_naming_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gc.install.shutil, "which", lambda name: None)
    with pytest.raises(gc.GeminiCliUnavailable, match="node is not on PATH.*install Node.js >= 20"):
        gc.node_executable()


def test_node_20_and_later_are_accepted(tmp_path: Path) -> None:
    for version in ("v20.0.0", "v22.11.3", "v24.1.0-nightly"):
        node = python_script(tmp_path / f"node-{version}", f"print({version!r})")
        assert gc.node_executable(str(node)) == str(node)


# --------------------------------------------------------------------------- settings, argv, env


def test_settings_select_api_key_auth_and_switch_everything_else_off() -> None:
    s = gc.gemini_settings()
    assert s["security"] == {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}}
    assert s["privacy"] == {"usageStatisticsEnabled": False} and s["telemetry"]["enabled"] is False
    assert s["general"]["enableAutoUpdate"] is False and s["general"]["checkpointing"] == {"enabled": False}
    assert s["ide"] == {"enabled": False}
    assert s["model"] == {"skipNextSpeakerCheck": True, "disableLoopDetection": True}
    assert s["tools"] == {"exclude": ["web_fetch", "google_web_search"]}


def test_settings_overrides_merge_deeply_and_none_removes() -> None:
    s = gc.gemini_settings({"model": {"disableLoopDetection": None, "maxSessionTurns": 4},
                            "tools": None, "general": {"maxAttempts": 1}})
    assert s["model"] == {"skipNextSpeakerCheck": True, "maxSessionTurns": 4} and "tools" not in s
    assert s["general"]["maxAttempts"] == 1 and s["general"]["enableAutoUpdate"] is False
    assert gc.gemini_settings()["model"]["disableLoopDetection"] is True  # OFFLINE_SETTINGS untouched


def test_argv_keeps_a_prompt_that_starts_with_a_dash() -> None:
    argv = gc.gemini_argv("/n/node", Path("/x/gemini.js"), "-starts with a dash", model="m", extra_args=["--debug"])
    assert argv == ["/n/node", "/x/gemini.js", "--prompt=-starts with a dash", "--approval-mode", "yolo", "-m", "m",
                    "--output-format", "stream-json", "--debug"]


def test_environment_is_built_from_scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GEMINI_API_KEY", "GOOGLE_API_KEY", "GOOGLE_GENAI_USE_VERTEXAI", "GOOGLE_CLOUD_PROJECT",
                 "HTTPS_PROXY", "GEMINI_CLI_HOME", "GEMINI_SANDBOX"):
        monkeypatch.setenv(name, "leak")
    env = gc.gemini_env(BASE + "/", tmp_path, api_key="tok", extra={"NO_COLOR": None, "X": "1"})
    assert not {"GOOGLE_API_KEY", "GOOGLE_GENAI_USE_VERTEXAI", "GOOGLE_CLOUD_PROJECT", "HTTPS_PROXY",
                "GEMINI_CLI_HOME", "GEMINI_SANDBOX", "NO_COLOR"} & set(env)
    assert env["GEMINI_API_KEY"] == "tok" and env["GEMINI_API_KEY_AUTH_MECHANISM"] == "bearer"
    assert env["GOOGLE_GEMINI_BASE_URL"] == BASE and env["X"] == "1" and env["GEMINI_CLI_NO_RELAUNCH"] == "true"
    assert env["HOME"] == str(tmp_path) and env["GEMINI_CLI_SYSTEM_SETTINGS_PATH"].startswith(str(tmp_path))


# --------------------------------------------------------------------------- runs of a stub node

_EVENTS = [
    {"type": "init", "session_id": "s-1", "model": "tokentrail-policy"},
    {"type": "message", "role": "user", "content": "do it"},
    {"type": "message", "role": "assistant", "content": "Let me ", "delta": True},
    {"type": "message", "role": "assistant", "content": "look.", "delta": True},
    {"type": "tool_use", "tool_name": "run_shell_command", "tool_id": "t1", "parameters": {"command": "ls"}},
    {"type": "tool_result", "tool_id": "t1", "status": "success", "output": "a"},
    {"type": "tool_use", "tool_name": "get_weather", "tool_id": "t2", "parameters": {}},
    {"type": "tool_result", "tool_id": "t2", "status": "error", "output": "Tool \"get_weather\" not found.",
     "error": {"type": "tool_not_registered", "message": "Tool \"get_weather\" not found."}},
    {"type": "message", "role": "assistant", "content": "All ", "delta": True},
    {"type": "message", "role": "assistant", "content": "done.", "delta": True},
    {"type": "result", "status": "success", "stats": {"total_tokens": 9}},
]

_STUB = r"""
import json, os, subprocess, sys, time
if sys.argv[1:] == ["--version"]:
    print("v20.11.1")
    sys.exit(0)
home = os.environ["HOME"]
with open(os.environ["STUB_RECORD"], "w") as f:
    json.dump({"argv": sys.argv, "cwd": os.getcwd(), "env": dict(os.environ),
               "settings": json.load(open(os.path.join(home, ".gemini", "settings.json"))),
               "stdin": sys.stdin.read()}, f)
""" + sleepers_source("32") + r"""
print("YOLO mode is enabled. All tool calls will be automatically approved.", file=sys.stderr)
if mode == "fail":
    print(json.dumps({"type": "init", "session_id": "s"}))
    print(json.dumps({"type": "error", "severity": "error", "message": "upstream said no"}))
    print(json.dumps({"type": "result", "status": "error", "error": {"message": "upstream said no"}}))
    sys.exit(1)
if mode == "hang":
    print(json.dumps({"type": "init", "session_id": "s"}), flush=True)
    time.sleep(3600)
for event in json.loads(os.environ["STUB_EVENTS"]):
    print(json.dumps(event))
"""


@pytest.fixture
def stub_node(tmp_path: Path) -> Path:
    return python_script(tmp_path / "bin" / "node", _STUB)


def _run_stub(stub_node: Path, tmp_path: Path, mode: str, *, env: dict[str, str] | None = None,
              **kwargs) -> tuple[gc.GeminiCliResult, dict]:
    return run_fake_cli(tmp_path, mode, _EVENTS, lambda workdir, stub_env: gc.run_gemini_cli(
        BASE, "do it", workdir=workdir, node=str(stub_node), entry=Path("/x/gemini.js"), env=stub_env, **kwargs), env)


def test_run_writes_settings_into_a_fresh_home_and_removes_it(stub_node: Path, tmp_path: Path) -> None:
    result, seen = _run_stub(stub_node, tmp_path, "ok", settings={"general": {"maxAttempts": 2}}, api_key="tok-1")
    expected = gc.gemini_argv(str(stub_node), Path("/x/gemini.js"), "do it", model="tokentrail-policy")
    assert seen["argv"][1:] == expected[1:] and result.argv == expected
    assert seen["cwd"] == str(tmp_path / "work") and seen["stdin"] == ""
    env = seen["env"]
    assert env["GOOGLE_GEMINI_BASE_URL"] == BASE and env["GEMINI_API_KEY"] == "tok-1"
    assert not Path(env["HOME"]).exists()  # the throw-away home is gone after the run
    assert seen["settings"] == result.settings and seen["settings"]["general"]["maxAttempts"] == 2
    assert seen["settings"]["security"]["auth"]["selectedType"] == "gemini-api-key"


def test_run_keeps_a_given_home(stub_node: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    _, seen = _run_stub(stub_node, tmp_path, "ok", home=home)
    assert seen["env"]["HOME"] == str(home) and (home / ".gemini" / "settings.json").is_file()


def test_events_are_parsed_into_the_result(stub_node: Path, tmp_path: Path) -> None:
    result, _ = _run_stub(stub_node, tmp_path, "ok")
    assert result.ok and result.returncode == 0 and not result.timed_out
    assert result.events == _EVENTS and result.session_id == "s-1"
    assert result.final_text == "All done."  # the deltas after the last tool event
    assert [(u["tool_name"], r["status"]) for u, r in zip(result.tool_uses(), result.tool_results(), strict=True)] \
        == [("run_shell_command", "success"), ("get_weather", "error")]
    assert result.result == {"type": "result", "status": "success", "stats": {"total_tokens": 9}}
    assert "YOLO mode" in result.stderr_tail


def test_a_failed_run_is_not_ok(stub_node: Path, tmp_path: Path) -> None:
    result, _ = _run_stub(stub_node, tmp_path, "fail")
    assert not result.ok and result.returncode == 1 and result.final_text is None
    assert [e["message"] for e in result.errors()] == ["upstream said no"]


@needs_proc
def test_the_timeout_kills_the_cli_and_everything_it_started(stub_node: Path, tmp_path: Path) -> None:
    result = check_the_timeout_kills_the_tree(functools.partial(_run_stub, stub_node, tmp_path), "32")
    assert result.session_id == "s"  # what it printed before the timeout is kept


@needs_proc
def test_no_process_outlives_a_normal_exit(stub_node: Path, tmp_path: Path) -> None:
    check_no_process_outlives_a_normal_exit(functools.partial(_run_stub, stub_node, tmp_path), "32")


# --------------------------------------------------------------------------- the real CLI


@pytest.fixture(scope="module")
def gemini_entry() -> Path:
    def ensure() -> Path:
        entry = gc.ensure_gemini_cli()
        gc.node_executable()
        return entry

    return installed_or_skip(ensure, gc.GeminiCliUnavailable, f"Gemini CLI {gc.GEMINI_CLI_VERSION}")


def test_real_cli_runs_its_shell_tool_against_the_stub_and_calls_nothing_else(
        gemini_entry: Path, tmp_path: Path) -> None:
    replies = [gc.shell_call("echo tokentrail", call_id="call_t_1"), gc.text_reply("Done: ", "it printed tokentrail.")]
    with gc.RecordingGeminiStub(gc.scripted(replies)) as stub:
        result = gc.run_gemini_cli(stub.url + "/ng-rollout/r-9/training-token-capture/",
                                   "Run `echo tokentrail` and tell me what it printed.", workdir=tmp_path,
                                   entry=gemini_entry, timeout=90, api_key="rollout-token-9")
    assert result.ok, f"exit {result.returncode}; {result.errors()}; {result.stderr_tail}"
    assert result.final_text == "Done: it printed tokentrail."
    (use,), (res,) = result.tool_uses(), result.tool_results()
    assert use["tool_name"] == "run_shell_command" and use["parameters"] == {"command": "echo tokentrail"}
    assert res["status"] == "success" and res["output"] == "tokentrail"

    # Offline: exactly the two streamed model calls, under the rollout's path prefix, and nothing else.
    path = "/ng-rollout/r-9/training-token-capture/v1beta/models/tokentrail-policy:streamGenerateContent"
    assert [(r.method, r.path, r.query) for r in stub.requests] == [("POST", path, {"alt": "sse"})] * 2
    headers = stub.requests[0].headers
    assert headers["x-goog-api-key"] == "rollout-token-9" and headers["authorization"] == "Bearer rollout-token-9"
    assert "x-gemini-api-privileged-user-id" not in headers  # usage statistics off
    first, second = (r.body for r in stub.requests)
    assert set(first) == {"contents", "systemInstruction", "tools", "generationConfig"}
    names = [d["name"] for d in first["tools"][0]["functionDeclarations"]]
    assert gc.SHELL_TOOL in names and not {"web_fetch", "google_web_search"} & set(names)
    shell = next(d for d in first["tools"][0]["functionDeclarations"] if d["name"] == gc.SHELL_TOOL)
    assert shell["parametersJsonSchema"]["required"] == ["command"]
    # The second request repeats the first's contents and appends the call and its response.
    assert second["contents"][:1] == first["contents"]
    call, response = second["contents"][1:]
    assert call == {"role": "model", "parts": [{"functionCall": {"id": "call_t_1", "args": {"command": "echo tokentrail"},
                                                                 "name": gc.SHELL_TOOL},
                                                "thoughtSignature": "skip_thought_signature_validator"}]}
    (part,) = response["parts"]
    assert response["role"] == "user" and part["functionResponse"]["id"] == "call_t_1"
    assert "Output: tokentrail" in part["functionResponse"]["response"]["output"]


def test_real_cli_requests_match_the_fixtures(gemini_entry: Path) -> None:
    index = json.loads((FIXTURES / "index.json").read_text())
    assert index["gemini_cli_version"] == gc.GEMINI_CLI_VERSION
    for name in gfx.SCENARIOS:
        recording = gfx.record_scenario(name, entry=gemini_entry, timeout=90)
        assert recording.result.ok, recording.result.stderr_tail
        expected = [json.loads((FIXTURES / e["file"]).read_text()) for e in index["scenarios"][name]["requests"]]
        assert recording.requests == expected, (
            f"the CLI's requests drifted from tests/fixtures/gemini_cli; regenerate: {index['regenerate']}")


@needs_proc
def test_real_cli_is_killed_at_the_timeout(gemini_entry: Path, tmp_path: Path) -> None:
    result = check_real_cli_killed_at_the_timeout(
        tmp_path, gc.RecordingGeminiStub, lambda: gc.text_reply("too late"),
        lambda stub, home: gc.run_gemini_cli(stub.base_url, "hello", workdir=tmp_path, timeout=5,
                                             entry=gemini_entry, home=home),
        lambda stub: stub.generate_requests())
    assert not result.ok
