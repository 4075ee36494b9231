"""The Codex CLI runner: pins, install, config, argv, environment, event parsing, timeout and kill.

Most tests run a stub executable in place of the CLI (it records its argv, environment, working
directory and the generated ``config.toml``, then prints scripted ``--json`` events, fails, hangs
or leaves processes behind). The tests marked "real CLI" install the pinned CLI on first use
(``ensure_codex``: ``npm ci`` into ``.tokentrail/codex``) and are skipped, with the reason, only
when that is impossible here (no npm, or the registry unreachable).
"""

from __future__ import annotations

import functools
import json
import platform
import threading
import tomllib
from pathlib import Path

import pytest

from compose.harnesses import codex as cx
from compose.harnesses import npm
from tests.unit.compose.harnesses.harness_cli_helpers import (
    check_no_process_outlives_a_normal_exit,
    check_pins,
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

# --------------------------------------------------------------------------- pins and install


def test_the_three_pins_agree() -> None:
    wrapper, natives = check_pins(cx.PIN_DIR, cx.CODEX_PACKAGE, cx.CODEX_VERSION)
    assert "hasInstallScript" not in wrapper  # nothing runs at install, nothing is downloaded
    # Every platform binary is an alias of @openai/codex@<version>-<platform>, with its hash.
    for key, entry in natives.items():
        suffix = key.removeprefix(f"node_modules/{cx.CODEX_PACKAGE}-")
        assert wrapper["optionalDependencies"][f"{cx.CODEX_PACKAGE}-{suffix}"] == \
            f"npm:{cx.CODEX_PACKAGE}@{cx.CODEX_VERSION}-{suffix}"
        assert entry["name"] == cx.CODEX_PACKAGE and entry["version"] == f"{cx.CODEX_VERSION}-{suffix}"
        assert entry["integrity"].startswith("sha512-") and "hasInstallScript" not in entry


@pytest.mark.parametrize(("system", "machine", "package", "triple"), [
    ("Linux", "x86_64", "@openai/codex-linux-x64", "x86_64-unknown-linux-musl"),
    ("Linux", "aarch64", "@openai/codex-linux-arm64", "aarch64-unknown-linux-musl"),
    ("Darwin", "arm64", "@openai/codex-darwin-arm64", "aarch64-apple-darwin"),
    ("Windows", "AMD64", "@openai/codex-win32-x64", "x86_64-pc-windows-msvc"),
])
def test_platform_package_and_binary_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, system: str,
                                          machine: str, package: str, triple: str) -> None:
    monkeypatch.setattr(platform, "system", lambda: system)
    monkeypatch.setattr(platform, "machine", lambda: machine)
    assert cx.platform_package() == package and cx.target_triple() == triple
    exe = "codex.exe" if system == "Windows" else "codex"
    assert cx.binary_path(tmp_path) == (tmp_path / ".tokentrail/codex/node_modules" / package / "vendor" / triple
                                        / "bin" / exe)


def test_unsupported_platform_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform, "machine", lambda: "riscv64")
    with pytest.raises(cx.CodexUnavailable, match="no native binary"):
        cx.platform_package()


def _fake_install(root: Path, version: str = cx.CODEX_VERSION) -> Path:
    modules = cx.install_dir(root) / "node_modules"
    (modules / cx.CODEX_PACKAGE).mkdir(parents=True)
    (modules / cx.CODEX_PACKAGE / "package.json").write_text(json.dumps({"version": version}))
    native = modules / cx.platform_package()
    native.mkdir(parents=True)
    suffix = cx.platform_package().removeprefix(f"{cx.CODEX_PACKAGE}-")
    (native / "package.json").write_text(json.dumps({"version": f"{version}-{suffix}"}))
    binary = cx.binary_path(root)
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    return binary


def test_ensure_is_idempotent_without_starting_npm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    binary = _fake_install(tmp_path)
    forbid_npm(monkeypatch, "ensure_codex")
    assert cx.ensure_codex(tmp_path) == binary and cx.ensure_codex(tmp_path) == binary
    assert cx.installed_version(tmp_path) == cx.CODEX_VERSION


def test_ensure_reinstalls_another_version_and_names_the_fix_without_npm(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_install(tmp_path, version="0.1.0")
    monkeypatch.setattr(npm.shutil, "which", lambda name: None)
    with pytest.raises(cx.CodexUnavailable, match="npm is not on PATH.*python -m compose.harnesses.codex install"):
        cx.ensure_codex(tmp_path)


def test_ensure_runs_npm_ci_from_the_pin_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_npm_ci(monkeypatch, lambda: _fake_install(tmp_path))
    target = cx.install_dir(tmp_path)
    target.mkdir(parents=True)
    assert cx.ensure_codex(tmp_path) == cx.binary_path(tmp_path)
    (argv, cwd), = calls
    assert cwd == target and argv[:3] == ["/usr/bin/npm", "ci", "--ignore-scripts"] and "--include=optional" in argv
    assert (target / "package.json").read_text() == (cx.PIN_DIR / "package.json").read_text()
    assert (target / "package-lock.json").read_text() == (cx.PIN_DIR / "package-lock.json").read_text()


# --------------------------------------------------------------------------- config, argv, env


def test_config_is_a_responses_provider_with_everything_else_off() -> None:
    text = cx.to_toml(cx.codex_config("http://127.0.0.1:9/ng-rollout/r-1/training-token-capture/v1/"))
    config = tomllib.loads(text)
    assert config["model"] == "tokentrail-policy" and config["model_provider"] == "tokentrail"
    assert config["model_providers"]["tokentrail"] == {
        "name": "tokentrail interceptor", "base_url": "http://127.0.0.1:9/ng-rollout/r-1/training-token-capture/v1",
        "wire_api": "responses", "env_key": cx.API_KEY_ENV, "request_max_retries": 0, "stream_max_retries": 0}
    assert config["approval_policy"] == "never" and config["sandbox_mode"] == "danger-full-access"
    assert config["check_for_update_on_startup"] is False and config["web_search"] == "disabled"
    assert config["analytics"] == {"enabled": False} and config["feedback"] == {"enabled": False}
    assert config["otel"]["exporter"] == "none" and config["history"] == {"persistence": "none"}
    assert config["features"]["plugins"] is False and config["features"]["apps"] is False


def test_config_overrides_merge_table_by_table_and_none_removes() -> None:
    config = cx.codex_config("http://h/v1", model="m", overrides={
        "features": {"goals": False, "plugins": None},
        "model_providers": {"tokentrail": {"stream_max_retries": 2}},
        "web_search": None, "shell_environment_policy": {"inherit": "core"}})
    assert config["model"] == "m" and "web_search" not in config
    assert config["features"]["goals"] is False and "plugins" not in config["features"]
    assert config["features"]["apps"] is False
    provider = config["model_providers"]["tokentrail"]
    assert provider["stream_max_retries"] == 2 and provider["wire_api"] == "responses"
    assert tomllib.loads(cx.to_toml(config)) == config
    assert cx.codex_config("http://h/v1")["features"]["plugins"] is False  # OFFLINE_CONFIG untouched


def test_toml_writer_round_trips() -> None:
    value = {"a": 'quote " back \\ slash\nnewline ünï', "b": True, "c": 3, "d": 0.5, "e": ["x", 1, False],
             "t": {"k-1": "v", "odd key": "w", "u": {"deep": [1, 2]}}, "empty": {}}
    assert tomllib.loads(cx.to_toml(value)) == value


def test_argv_is_non_interactive_and_ends_with_the_prompt(tmp_path: Path) -> None:
    argv = cx.codex_argv("/x/codex", "-starts with a dash", workdir=tmp_path, model="m", extra_args=["--oss"])
    assert argv == ["/x/codex", "exec", "--json", "--color", "never", "--skip-git-repo-check", "--ephemeral",
                    "--ignore-rules", "--strict-config", "-C", str(tmp_path), "--model", "m", "--oss",
                    "--", "-starts with a dash"]


def test_environment_is_built_from_scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "CODEX_HOME", "HTTPS_PROXY", "ALL_PROXY", "RUST_LOG"):
        monkeypatch.setenv(name, "leak")
    env = cx.codex_env(tmp_path, extra={"NO_COLOR": None, "X": "1"})
    assert not {"OPENAI_API_KEY", "OPENAI_BASE_URL", "HTTPS_PROXY", "ALL_PROXY", "RUST_LOG", "NO_COLOR"} & set(env)
    assert env["X"] == "1" and env[cx.API_KEY_ENV] == "sk-tokentrail-offline"
    assert env["HOME"] == str(tmp_path) and env["CODEX_HOME"] == str(tmp_path / ".codex")
    assert env["TMPDIR"] == str(tmp_path / "tmp")  # CODEX_HOME must not lie inside TMPDIR


# --------------------------------------------------------------------------- runs of a stub CLI

_EVENTS = [
    {"type": "thread.started", "thread_id": "thread-1"},
    {"type": "item.completed", "item": {"id": "item_0", "type": "error",
                                        "message": "Model metadata for `tokentrail-policy` not found."}},
    {"type": "turn.started"},
    {"type": "item.started", "item": {"id": "item_1", "type": "command_execution", "command": "/bin/bash -lc ls",
                                      "aggregated_output": "", "exit_code": None, "status": "in_progress"}},
    {"type": "item.completed", "item": {"id": "item_1", "type": "command_execution", "command": "/bin/bash -lc ls",
                                        "aggregated_output": "a\n", "exit_code": 0, "status": "completed"}},
    {"type": "item.completed", "item": {"id": "item_2", "type": "command_execution",
                                        "command": "/bin/bash -lc nope", "aggregated_output": "not found\n",
                                        "exit_code": 127, "status": "failed"}},
    {"type": "item.completed", "item": {"id": "item_3", "type": "agent_message", "text": "first"}},
    {"type": "item.completed", "item": {"id": "item_4", "type": "agent_message", "text": "All done."}},
    {"type": "turn.completed", "usage": {"input_tokens": 10, "cached_input_tokens": 0, "output_tokens": 3}},
]

_STUB = r"""
import json, os, subprocess, sys, time
home = os.environ["CODEX_HOME"]
with open(os.environ["STUB_RECORD"], "w") as f:
    json.dump({"argv": sys.argv, "cwd": os.getcwd(), "env": dict(os.environ),
               "config": open(os.path.join(home, "config.toml")).read(),
               "stdin": sys.stdin.read()}, f)
""" + sleepers_source("31") + r"""
print("not json: some banner")
if mode == "fail":
    print(json.dumps({"type": "thread.started", "thread_id": "t"}))
    print(json.dumps({"type": "error", "message": "upstream said no"}))
    print(json.dumps({"type": "turn.failed", "error": {"message": "upstream said no"}}))
    sys.exit(1)
if mode == "hang":
    print(json.dumps({"type": "thread.started", "thread_id": "t"}), flush=True)
    time.sleep(3600)
for event in json.loads(os.environ["STUB_EVENTS"]):
    print(json.dumps(event))
print("Reading additional input from stdin...", file=sys.stderr)
"""


@pytest.fixture
def stub_cli(tmp_path: Path) -> Path:
    return python_script(tmp_path / "bin" / "codex", _STUB)


def _run_stub(stub_cli: Path, tmp_path: Path, mode: str, *, env: dict[str, str] | None = None,
              **kwargs) -> tuple[cx.CodexResult, dict]:
    return run_fake_cli(tmp_path, mode, _EVENTS, lambda workdir, stub_env: cx.run_codex(
        "http://127.0.0.1:9/ng-rollout/r-1/training-token-capture/v1", "do it", workdir=workdir,
        executable=stub_cli, env=stub_env, **kwargs), env)


def test_run_writes_config_into_a_fresh_codex_home_and_removes_it(stub_cli: Path, tmp_path: Path) -> None:
    result, seen = _run_stub(stub_cli, tmp_path, "ok", config={"features": {"goals": False}})
    assert seen["argv"][1:] == cx.codex_argv(stub_cli, "do it", workdir=tmp_path / "work",
                                             model="tokentrail-policy")[1:]
    assert result.argv == cx.codex_argv(stub_cli, "do it", workdir=tmp_path / "work", model="tokentrail-policy")
    assert seen["cwd"] == str(tmp_path / "work") and seen["stdin"] == ""
    env = seen["env"]
    home = Path(env["HOME"])
    assert env["CODEX_HOME"] == str(home / ".codex") and env[cx.API_KEY_ENV] == "sk-tokentrail-offline"
    assert not home.exists()  # the throw-away home is gone after the run
    config = tomllib.loads(seen["config"])
    assert seen["config"] == result.config_toml
    assert config["model_providers"]["tokentrail"]["base_url"].endswith("/ng-rollout/r-1/training-token-capture/v1")
    assert config["features"]["goals"] is False and config["features"]["plugins"] is False


def test_run_keeps_a_given_home(stub_cli: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    _, seen = _run_stub(stub_cli, tmp_path, "ok", home=home)
    assert seen["env"]["HOME"] == str(home) and (home / ".codex" / "config.toml").is_file()


def test_events_are_parsed_into_the_result(stub_cli: Path, tmp_path: Path) -> None:
    result, _ = _run_stub(stub_cli, tmp_path, "ok")
    assert result.ok and result.returncode == 0 and not result.timed_out and result.completed
    assert result.events == _EVENTS  # the banner line is not an event
    assert result.thread_id == "thread-1" and result.final_text == "All done."
    assert result.usage == {"input_tokens": 10, "cached_input_tokens": 0, "output_tokens": 3}
    assert [(c["command"], c["exit_code"], c["status"]) for c in result.tool_calls()] == [
        ("/bin/bash -lc ls", 0, "completed"), ("/bin/bash -lc nope", 127, "failed")]
    assert [i["text"] for i in result.items("agent_message")] == ["first", "All done."]
    assert result.errors() == ["Model metadata for `tokentrail-policy` not found."]
    assert "Reading additional input" in result.stderr_tail


def test_a_failed_turn_is_not_ok(stub_cli: Path, tmp_path: Path) -> None:
    result, _ = _run_stub(stub_cli, tmp_path, "fail")
    assert not result.ok and result.returncode == 1 and not result.completed and result.final_text is None
    assert result.errors() == ["upstream said no", "upstream said no"]


def test_parse_events_skips_what_is_not_a_json_object() -> None:
    assert cx.parse_events('{"type": "a"}\n\nWARNING: x\n{broken\n[1, 2]\n  {"type": "b"}  \n') == [
        {"type": "a"}, {"type": "b"}]


@needs_proc
def test_the_timeout_kills_the_cli_and_everything_it_started(stub_cli: Path, tmp_path: Path) -> None:
    result = check_the_timeout_kills_the_tree(functools.partial(_run_stub, stub_cli, tmp_path), "31")
    assert result.thread_id == "t"  # what it printed before the timeout is kept


@needs_proc
def test_no_process_outlives_a_normal_exit(stub_cli: Path, tmp_path: Path) -> None:
    check_no_process_outlives_a_normal_exit(functools.partial(_run_stub, stub_cli, tmp_path), "31")


# --------------------------------------------------------------------------- the real CLI


@pytest.fixture(scope="module")
def codex_binary() -> Path:
    return installed_or_skip(cx.ensure_codex, cx.CodexUnavailable, f"Codex CLI {cx.CODEX_VERSION}")


class _ProxyRecorder:
    """A TCP listener standing in for an HTTP(S) proxy: records the first line of each connection
    (``CONNECT github.com:443 HTTP/1.1``) and hangs up, so nothing reaches the network."""

    def __init__(self) -> None:
        import socketserver

        lines = self.lines = []

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                lines.append(self.rfile.readline(4096).decode("latin-1").strip())

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_real_cli_runs_exec_command_against_the_responses_stub(codex_binary: Path, tmp_path: Path) -> None:
    replies = [cx.exec_command_call("echo tokentrail"), cx.text_reply("Done: it printed tokentrail.")]
    proxy = _ProxyRecorder()
    # Every connection not to 127.0.0.1 goes through the recorder (the CLI, and the git it runs
    # for plugin sync, honour these variables): with OFFLINE_CONFIG there must be none.
    via_proxy = {"HTTPS_PROXY": proxy.url, "HTTP_PROXY": proxy.url, "ALL_PROXY": proxy.url,
                 "https_proxy": proxy.url, "http_proxy": proxy.url, "NO_PROXY": "127.0.0.1,localhost"}
    try:
        with cx.RecordingResponsesStub(cx.scripted(replies)) as stub:
            result = cx.run_codex(stub.base_url, "Run `echo tokentrail` and tell me what it printed.",
                                  workdir=tmp_path, executable=codex_binary, timeout=60, env=via_proxy)
    finally:
        proxy.close()
    assert result.ok, f"exit {result.returncode}; {result.errors()}; {result.stderr_tail}"
    assert proxy.lines == [], f"the CLI tried to reach the network: {proxy.lines}"
    assert result.final_text == "Done: it printed tokentrail."
    (call,) = result.tool_calls()
    assert call["exit_code"] == 0 and call["aggregated_output"] == "tokentrail\n"
    assert "echo tokentrail" in call["command"]

    # Offline: the CLI made exactly the two model calls and nothing else.
    assert [(r.method, r.path) for r in stub.requests] == [("POST", "/v1/responses")] * 2
    first, second = (r.body for r in stub.requests)
    headers = stub.requests[0].headers
    assert headers["authorization"] == "Bearer sk-tokentrail-offline"
    assert json.loads(headers["x-codex-turn-metadata"])["analytics_enabled"] is False
    assert first["model"] == "tokentrail-policy" and first["stream"] is True and first["store"] is False
    assert not {"previous_response_id", "conversation", "background"} & set(first)
    # The default shell tool, exactly as the runner's docstring states it.
    shell = first["tools"][0]
    assert (shell["type"], shell["name"]) == ("function", "exec_command")
    params = shell["parameters"]
    assert params["required"] == ["cmd"] and params["properties"]["cmd"]["type"] == "string"
    assert {"workdir", "yield_time_ms", "max_output_tokens", "tty", "login", "shell"} <= set(params["properties"])
    assert not any(t.get("type") == "web_search" for t in first["tools"])
    # The second request repeats the first's input and appends the call and its output.
    assert second["input"][:len(first["input"])] == first["input"]
    call_item, output_item = second["input"][len(first["input"]):]
    assert call_item["type"] == "function_call" and call_item["name"] == "exec_command"
    assert json.loads(call_item["arguments"]) == {"cmd": "echo tokentrail"}
    assert output_item["type"] == "function_call_output" and output_item["call_id"] == call_item["call_id"]
    assert "Process exited with code 0" in output_item["output"] and "tokentrail" in output_item["output"]


@needs_proc
def test_real_cli_is_killed_at_the_timeout(codex_binary: Path, tmp_path: Path) -> None:
    result = check_real_cli_killed_at_the_timeout(
        tmp_path, cx.RecordingResponsesStub, lambda: cx.text_reply("too late"),
        lambda stub, home: cx.run_codex(stub.base_url, "hello", workdir=tmp_path, timeout=5,
                                        executable=codex_binary, home=home),
        lambda stub: stub.responses_requests())
    assert not result.ok
