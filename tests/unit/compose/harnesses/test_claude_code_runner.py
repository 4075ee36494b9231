"""The pinned Claude Code CLI, run headless and offline against the recording Anthropic stub.

The tests that need the CLI install it on first use (``ensure_claude_code``: ``npm ci`` into
``.tokentrail/claude-code``) and are skipped, with the reason, only when that is impossible here
(no npm, or the registry unreachable). The others check the pins, the stub and the fixtures.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path

import anthropic
import pytest

from compose.harnesses import claude_code as cc
from compose.harnesses.claude_code.runner import ClaudeCodeUsageError
from tests.unit.compose.harnesses.harness_cli_helpers import (
    check_pins,
    check_real_cli_killed_at_the_timeout,
    installed_or_skip,
    needs_proc,
    processes_with,
)

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "claude_code"


# --------------------------------------------------------------------------- no CLI needed


def test_the_three_pins_agree() -> None:
    _, natives = check_pins(cc.PIN_DIR, cc.CLAUDE_CODE_PACKAGE, cc.CLAUDE_CODE_VERSION)
    # Every platform binary is pinned to the same version, with an integrity hash.
    assert all(v["version"] == cc.CLAUDE_CODE_VERSION and v["integrity"] for v in natives.values())


def test_environment_is_built_from_scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", "leak")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    env = cc.claude_code_env("http://127.0.0.1:9/", tmp_path, extra={"DISABLE_TELEMETRY": None, "X": "1"})
    assert "ANTHROPIC_AUTH_TOKEN" not in env and "HTTPS_PROXY" not in env
    assert "DISABLE_TELEMETRY" not in env and env["X"] == "1"
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:9"
    assert env["HOME"] == str(tmp_path) and env["CLAUDE_CONFIG_DIR"] == str(tmp_path / ".claude")
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"


@pytest.mark.parametrize("kwargs", [{"persist_session": True}, {"resume": "7d0c2d3e-session"}])
def test_session_options_need_a_kept_home(tmp_path: Path, kwargs: dict) -> None:
    # A session saved in the default throw-away home would be gone before anything could resume it.
    with pytest.raises(ClaudeCodeUsageError, match="needs home="):
        cc.run_claude_code("http://127.0.0.1:9", "hello", workdir=tmp_path, executable=tmp_path / "absent", **kwargs)


def test_stub_speaks_the_messages_api_to_the_anthropic_sdk() -> None:
    with cc.RecordingAnthropicStub() as stub:
        client = anthropic.Anthropic(base_url=stub.base_url, api_key="x", max_retries=0)
        tools = [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}]
        ask = [{"role": "user", "content": "go"}]
        with client.messages.stream(model="m", max_tokens=64, messages=ask, tools=tools) as stream:
            first = stream.get_final_message()
        assert first.stop_reason == "tool_use"
        tool_use = first.content[0]
        assert tool_use.type == "tool_use" and tool_use.input == {"command": "echo tokentrail",
                                                                 "description": "Print tokentrail"}
        follow = [*ask, {"role": "assistant", "content": [tool_use.model_dump()]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use.id,
                                                "content": "tokentrail"}]}]
        second = client.messages.create(model="m", max_tokens=64, messages=follow, tools=tools)
        assert second.stop_reason == "end_turn" and "tokentrail" in second.content[0].text
        assert client.messages.count_tokens(model="m", messages=ask).input_tokens > 0
    assert [(r.method, r.path) for r in stub.requests] == [
        ("POST", "/v1/messages"), ("POST", "/v1/messages"), ("POST", "/v1/messages/count_tokens")]
    assert stub.requests[0].body["stream"] is True and stub.requests[0].response["stop_reason"] == "tool_use"


def _fixture_index() -> dict:
    return json.loads((FIXTURES / "index.json").read_text())


def test_fixtures_are_complete_and_describe_tool_round_trips() -> None:
    index = _fixture_index()
    assert index["claude_code_version"] == cc.CLAUDE_CODE_VERSION, (
        f"fixtures are from another CLI version; regenerate: {index['regenerate']}")
    assert set(index["scenarios"]) == set(cc.SCENARIOS)
    for name, scenario in index["scenarios"].items():
        requests = [json.loads((FIXTURES / entry["file"]).read_text()) for entry in scenario["requests"]]
        for entry, req in zip(scenario["requests"], requests):
            assert len(cc.compact_json(req["body"])) == entry["body_bytes"] == int(req["headers"]["content-length"])
            assert (req["method"], req["path"], req["query"]) == ("POST", "/v1/messages", {"beta": "true"})
        # Each request repeats the previous one's messages and appends the answer and the tool result.
        for prev, nxt in zip(requests, requests[1:]):
            answer = prev["response"]["content"]
            appended = nxt["body"]["messages"][len(prev["body"]["messages"]):]
            assert [m["role"] for m in appended] == ["assistant", "user"], name
            uses = [b for b in answer if b["type"] == "tool_use"]
            echoed = [b for b in appended[0]["content"] if b["type"] == "tool_use"]
            assert [(b["id"], b["name"], b["input"]) for b in echoed] == [(b["id"], b["name"], b["input"]) for b in uses]
            results = appended[1]["content"]
            assert [r["tool_use_id"] for r in results] == [b["id"] for b in uses]
        assert requests[-1]["response"]["stop_reason"] == "end_turn"
        assert scenario["cli_result"]["is_error"] is False


# --------------------------------------------------------------------------- the real CLI


@pytest.fixture(scope="module")
def claude_binary() -> Path:
    return installed_or_skip(cc.ensure_claude_code, cc.ClaudeCodeUnavailable,
                             f"Claude Code CLI {cc.CLAUDE_CODE_VERSION}")


@pytest.fixture(scope="module")
def bash_two_turn(claude_binary: Path) -> cc.Recording:
    return cc.record_scenario("bash_two_turn", executable=claude_binary)


def test_real_cli_completes_a_two_turn_bash_session(bash_two_turn: cc.Recording) -> None:
    result = bash_two_turn.result
    assert result.ok, f"exit {result.returncode}; stderr: {result.stderr_tail}; stdout: {result.stdout_tail}"
    assert result.final_text == cc.FIXTURE_FINAL and result.num_turns == 2
    # The CLI really ran `echo tokentrail` through its Bash tool.
    assert [(r["content"], r["is_error"]) for r in result.tool_results()] == [("tokentrail", False)]

    requests = bash_two_turn.requests
    assert [(r["method"], r["path"], r["query"]) for r in requests] == [("POST", "/v1/messages", {"beta": "true"})] * 2
    first, second = (r["body"] for r in requests)
    assert first["stream"] is True and second["stream"] is True
    assert "Bash" in {t["name"] for t in first["tools"]}
    assert requests[0]["response"]["stop_reason"] == "tool_use"
    tool_use = requests[0]["response"]["content"][0]
    *history, assistant, user = second["messages"]
    assert history == [_without_cache_control(m) for m in first["messages"]]
    assert assistant == {"role": "assistant", "content": [tool_use]}
    (tool_result,) = user["content"]
    assert tool_result["type"] == "tool_result" and tool_result["tool_use_id"] == tool_use["id"]
    assert "tokentrail" in json.dumps(tool_result["content"])
    assert second["system"] == first["system"] and second["tools"] == first["tools"]
    assert requests[1]["response"]["stop_reason"] == "end_turn"


def _without_cache_control(message: dict) -> dict:
    """The CLI keeps cache_control on the newest message only; an un-marked lone text block
    becomes a plain string."""
    content = message["content"]
    if not isinstance(content, list):
        return message
    blocks = [{k: v for k, v in b.items() if k != "cache_control"} for b in content]
    if any("cache_control" in b for b in content) and len(blocks) == 1 and blocks[0]["type"] == "text":
        return {**message, "content": blocks[0]["text"]}
    return {**message, "content": blocks}


@pytest.mark.skipif(platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"),
                    reason="fixtures were recorded on linux-x64; the prompt names the platform")
def test_real_cli_still_sends_what_the_fixtures_hold(bash_two_turn: cc.Recording) -> None:
    index = _fixture_index()
    expected = [json.loads((FIXTURES / e["file"]).read_text())
                for e in index["scenarios"]["bash_two_turn"]["requests"]]
    live = bash_two_turn.requests
    assert [r["body"] for r in live] == [r["body"] for r in expected], (
        f"the CLI's requests drifted from tests/fixtures/claude_code; regenerate: {index['regenerate']}")
    volatile = {"host", "content-length", "x-stainless-arch", "x-stainless-os", "x-stainless-runtime-version"}
    for got, want in zip(live, expected):
        assert {k: v for k, v in got["headers"].items() if k not in volatile} == \
            {k: v for k, v in want["headers"].items() if k not in volatile}


def test_real_cli_resumes_a_persisted_session(claude_binary: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    replies = [cc.text_reply("first answer"), cc.text_reply("second answer")]
    with cc.RecordingAnthropicStub(cc.scripted(replies)) as stub:
        first = cc.run_claude_code(stub.base_url, "first prompt", workdir=tmp_path, executable=claude_binary,
                                   home=home, persist_session=True)
        assert first.ok and "--no-session-persistence" not in first.argv, first.stderr_tail
        second = cc.run_claude_code(stub.base_url, "second prompt", workdir=tmp_path, executable=claude_binary,
                                    home=home, resume=first.session_id)
        assert second.ok and second.final_text == "second answer", second.stderr_tail
        default = cc.run_claude_code(stub.base_url, "third prompt", workdir=tmp_path, executable=claude_binary)
        assert default.ok and "--no-session-persistence" in default.argv
    assert second.session_id == first.session_id
    resumed = json.dumps(stub.messages_requests()[1].body["messages"])
    # The resumed run's request carries the saved conversation, then the new prompt.
    assert resumed.index("first prompt") < resumed.index("first answer") < resumed.index("second prompt")


@needs_proc
def test_real_cli_leaves_no_process_behind(claude_binary: Path, tmp_path: Path) -> None:
    command = "(sleep 3171 &); nohup sleep 3172 >/dev/null 2>&1 & setsid sleep 3173 & echo tokentrail"
    replies = [cc.bash_tool_use(command), cc.text_reply("started")]
    with cc.RecordingAnthropicStub(cc.scripted(replies)) as stub:
        result = cc.run_claude_code(stub.base_url, "start three sleepers", workdir=tmp_path,
                                    allowed_tools=["Bash"], executable=claude_binary)
    assert result.ok, result.stderr_tail
    assert [r["content"] for r in result.tool_results()] == ["tokentrail"]
    assert processes_with("sleep 317") == []


@needs_proc
def test_real_cli_is_killed_at_the_timeout(claude_binary: Path, tmp_path: Path) -> None:
    result = check_real_cli_killed_at_the_timeout(
        tmp_path, cc.RecordingAnthropicStub, lambda: cc.text_reply("too late"),
        lambda stub, home: cc.run_claude_code(stub.base_url, "hello", workdir=tmp_path, timeout=5,
                                              executable=claude_binary, home=home),
        lambda stub: stub.messages_requests())
    assert result.result is None
