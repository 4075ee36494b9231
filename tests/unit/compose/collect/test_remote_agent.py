"""The remote-agent driver against the sample agent service, on real sockets, with a fake model endpoint."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from compose.collect import agent_service
from compose.collect.outcome import FailureClass
from compose.collect.remote_agent import RemoteAgent, drive
from compose.collect.tools import ToolSet
from schemas.errors import ConfigError
from tests.unit.compose.asgi_server import serve

API_KEY = "sk-rollout-secret"


@dataclass(frozen=True)
class FakeTask:
    id: str = "sum-1"
    prompt: str = "What is the sum of the numbers in the file?"
    tools: tuple[dict, ...] = ()
    files: dict = field(default_factory=dict)


class RecordingTools(ToolSet):
    """A ToolSet that remembers which tools the collector ran."""

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.ran: list[str] = []

    def call(self, name, arguments):  # type: ignore[override]
        self.ran.append(name)
        return super().call(name, arguments)


class Recording(httpx.AsyncHTTPTransport):
    """httpx's own transport, counting connection attempts and keeping each request sent."""

    def __init__(self, drop_cookies: bool = False) -> None:
        super().__init__()
        self.requests: list[httpx.Request] = []
        self.drop_cookies = drop_cookies

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.drop_cookies:
            request.headers.pop("cookie", None)
        self.requests.append(request)
        return await super().handle_async_request(request)

    def bodies(self) -> list[dict]:
        return [json.loads(r.content) for r in self.requests]


def model_app(calls: list[dict]) -> Starlette:
    """Stands in for the capture URL: answers every chat completion, remembering its body."""

    async def completions(request: Request) -> JSONResponse:
        body = await request.json()
        calls.append({"body": body, "authorization": request.headers.get("authorization")})
        return JSONResponse({
            "id": f"chatcmpl-{len(calls)}", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": f"model reply {len(calls)}"}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

    return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])


@pytest.fixture
async def model() -> AsyncIterator[tuple[str, list[dict]]]:
    calls: list[dict] = []
    async with serve(model_app(calls)) as url:
        yield f"{url}/v1", calls


def make_workdir(root: Path, content: str = "1\n2\n3\n4\n5\n") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "numbers.txt").write_text(content)
    (root / "notes").mkdir(exist_ok=True)  # listed first: the service must skip directories
    return root


async def run(url: str, model_url: str, workdir: Path, *, transport=None, tools=None, rollout_id="r-1", **agent):
    return await drive(RemoteAgent(url, **agent), task=FakeTask(), rollout_id=rollout_id,
                       tools=tools or ToolSet(workdir), model_base_url=model_url, model_api_key=API_KEY,
                       transport=transport)


def closed_port() -> int:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # bound, never listening, now closed: connections are refused
    return port


# -- the loop -----------------------------------------------------------------------------------

async def test_three_steps_to_the_answer_one_model_chain(model, tmp_path: Path):
    model_url, calls = model
    tools, transport = RecordingTools(make_workdir(tmp_path / "w")), Recording()
    async with serve(agent_service.create_app()) as url:
        outcome = await run(url, model_url, tmp_path, tools=tools, transport=transport)
    assert outcome.failure is None, outcome.failure
    assert "<answer>15</answer>" in outcome.final_text and outcome.steps == 3
    assert outcome.final_response_id.startswith("resp_agent_")
    # Exactly one model call a step, through the capture URL with the rollout's key; one chain.
    assert len(calls) == 3 and all(c["authorization"] == f"Bearer {API_KEY}" for c in calls)
    messages = [c["body"]["messages"] for c in calls]
    for i in range(2):
        reply = {"role": "assistant", "content": f"model reply {i + 1}"}
        assert messages[i + 1][:len(messages[i]) + 1] == messages[i] + [reply]
        assert len(messages[i + 1]) == len(messages[i]) + 2
    assert messages[1][-1]["content"] == "Tool list_files returned: notes/\nnumbers.txt"
    assert messages[2][-1]["content"] == "Tool read_file returned: 1\n2\n3\n4\n5\n"
    # The collector ran the two unpaired calls, never the service's own "note".
    assert tools.ran == ["list_files", "read_file"]
    bodies = transport.bodies()
    assert len(bodies) == 3
    assert all(b["model"] == "tokentrail-policy" and b["store"] is False and b["tools"] == tools.definitions()
               for b in bodies)
    last = bodies[2]["input"]
    note = next(i for i in last if i.get("name") == "note")
    records = [i for i in last if i.get("call_id") == note["call_id"]]
    assert [r["type"] for r in records] == ["function_call", "function_call_output"]
    assert records[1]["output"] == "noted" and records[1]["id"].startswith("fco_")  # the service's, untouched
    assert last[0] == {"type": "message", "role": "user", "content": FakeTask().prompt}
    # Headers on every request; the session cookie set by step 1 comes back on steps 2 and 3.
    for request in transport.requests:
        assert request.headers["x-tokentrail-rollout-id"] == "r-1"
        assert request.headers["x-tokentrail-model-base-url"] == model_url
        assert request.headers["x-tokentrail-model-api-key"] == API_KEY
    cookies = [r.headers.get("cookie") for r in transport.requests]
    assert cookies[0] is None and cookies[1] == cookies[2] and cookies[1].startswith("tt_agent_session=")


async def test_concurrent_rollouts_keep_their_own_sessions(model, tmp_path: Path):
    model_url, calls = model
    app = agent_service.create_app()
    transports = [Recording(), Recording()]
    async with serve(app) as url:
        outcomes = await asyncio.gather(
            run(url, model_url, make_workdir(tmp_path / "a"), transport=transports[0], rollout_id="r-a"),
            run(url, model_url, make_workdir(tmp_path / "b", "10 20\n"), transport=transports[1], rollout_id="r-b"))
    assert "<answer>15</answer>" in outcomes[0].final_text
    assert "<answer>30</answer>" in outcomes[1].final_text
    assert len(calls) == 6 and len(app.state.sessions) == 2
    cookie_a, cookie_b = (t.requests[1].headers["cookie"] for t in transports)
    assert cookie_a != cookie_b


async def test_a_collector_that_drops_cookies_fails_visibly(model, tmp_path: Path):
    async with serve(agent_service.create_app()) as url:
        outcome = await run(url, model[0], make_workdir(tmp_path / "w"), transport=Recording(drop_cookies=True))
    assert outcome.failure.failure_class is FailureClass.TRANSPORT and outcome.steps == 2
    assert "HTTP 400" in outcome.failure.detail and "no tt_agent_session cookie" in outcome.failure.detail


# -- failures -----------------------------------------------------------------------------------

async def test_malformed_reply_is_a_terminal_schema_failure(model, tmp_path: Path):
    async with serve(agent_service.create_app("malformed")) as url:
        outcome = await run(url, model[0], make_workdir(tmp_path / "w"))
    assert outcome.failure.failure_class is FailureClass.SCHEMA and outcome.failure.terminal
    assert "not a valid Responses object: at id: Field required" in outcome.failure.detail
    assert outcome.final_text is None and outcome.steps == 1


async def test_http_error_is_transport_not_terminal(model, tmp_path: Path):
    async with serve(agent_service.create_app("error")) as url:
        outcome = await run(url, model[0], make_workdir(tmp_path / "w"))
    assert outcome.failure.failure_class is FailureClass.TRANSPORT and not outcome.failure.terminal
    assert "answered HTTP 500" in outcome.failure.detail and "injected failure" in outcome.failure.detail


async def test_refused_connections_are_tried_three_times_then_transport(tmp_path: Path):
    transport = Recording()
    outcome = await run(f"http://127.0.0.1:{closed_port()}", "http://127.0.0.1:1/v1", make_workdir(tmp_path / "w"),
                        transport=transport)
    assert outcome.failure.failure_class is FailureClass.TRANSPORT and not outcome.failure.terminal
    assert len(transport.requests) == 3 and "ConnectError" in outcome.failure.detail
    assert "after 3 connection attempts" in outcome.failure.detail and outcome.steps == 1


async def test_a_server_that_disconnects_is_tried_three_times(tmp_path: Path):
    accepted = 0

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        await reader.read(1)
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        outcome = await run(f"http://127.0.0.1:{port}", "http://127.0.0.1:1/v1", make_workdir(tmp_path / "w"),
                            connect_attempts=3)
    assert outcome.failure.failure_class is FailureClass.TRANSPORT and accepted == 3
    assert "RemoteProtocolError" in outcome.failure.detail


async def test_slow_service_is_a_timeout_after_one_attempt(model, tmp_path: Path):
    transport = Recording()
    async with serve(agent_service.create_app("slow")) as url:
        outcome = await run(url, model[0], make_workdir(tmp_path / "w"), transport=transport, request_timeout_s=0.5)
    assert outcome.failure.failure_class is FailureClass.TIMEOUT and not outcome.failure.terminal
    assert len(transport.requests) == 1 and "request_timeout_s=0.5" in outcome.failure.detail


async def test_no_final_message_is_max_steps(model, tmp_path: Path):
    model_url, calls = model
    async with serve(agent_service.create_app("no_final")) as url:
        outcome = await run(url, model_url, make_workdir(tmp_path / "w"), max_steps=3)
    assert outcome.failure.failure_class is FailureClass.MAX_STEPS and outcome.steps == 3
    assert "max_steps=3" in outcome.failure.detail and "list_files" in outcome.failure.detail
    assert len(calls) == 3


async def test_model_endpoint_down_is_the_services_502(tmp_path: Path):
    async with serve(agent_service.create_app()) as url:
        outcome = await run(url, f"http://127.0.0.1:{closed_port()}/v1", make_workdir(tmp_path / "w"))
    assert outcome.failure.failure_class is FailureClass.TRANSPORT
    assert "HTTP 502" in outcome.failure.detail and "model call" in outcome.failure.detail


# -- a scripted service: replies chosen by the test -------------------------------------------

def scripted(replies: list[Callable[[dict], Response]], seen: list[dict]) -> Starlette:
    async def responses(request: Request) -> Response:
        body = await request.json()
        seen.append(body)
        return replies[len(seen) - 1](body)

    return Starlette(routes=[Route("/v1/responses", responses, methods=["POST"])])


def response(*output: dict, **extra: Any) -> Callable[[dict], Response]:
    body = {"id": "resp_1", "object": "response", "created_at": 1.0, "model": "m", "output": list(output),
            "parallel_tool_calls": False, "tool_choice": "auto", "tools": [], **extra}
    return lambda request_body: JSONResponse(body)


def call(name: str, arguments: str, call_id: str) -> dict:
    return {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id, "name": name, "arguments": arguments}


def message(text: str) -> dict:
    return {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


async def test_tool_errors_go_back_as_outputs_not_failures(tmp_path: Path):
    seen: list[dict] = []
    app = scripted([response(call("nope", "{}", "c1"), call("read_file", "{bad", "c2"),
                             call("calculator", '{"expression": "6 * 7"}', "c3")),
                    response(message("done: "), message("42"))], seen)
    async with serve(app) as url:
        outcome = await run(url, "http://127.0.0.1:1/v1", make_workdir(tmp_path / "w"))
    assert outcome.failure is None and outcome.final_text == "done: 42" and outcome.steps == 2
    outputs = {i["call_id"]: i["output"] for i in seen[1]["input"] if i["type"] == "function_call_output"}
    assert outputs["c1"].startswith("error: unknown tool 'nope'; available: read_file, list_files")
    assert outputs["c2"].startswith("error: arguments for 'read_file' are not valid JSON")
    assert outputs["c3"] == "42"


@pytest.mark.parametrize("reply, failure_class, detail", [
    (lambda b: Response("<html>hi</html>", media_type="text/html"), FailureClass.SCHEMA, "the reply is not JSON"),
    (lambda b: JSONResponse([1, 2]), FailureClass.SCHEMA, "not a valid Responses object"),
    (response({"type": "mystery", "id": "x"}), FailureClass.SCHEMA, "at output.0"),
    (response(call("read_file", "{}", "c1"), status="failed", error={"code": "server_error", "message": "oops"}),
     FailureClass.INVALID_OUTPUT, "status 'failed': oops"),
    (response(message("partial"), status="incomplete", incomplete_details={"reason": "max_output_tokens"}),
     FailureClass.INVALID_OUTPUT, "status 'incomplete': max_output_tokens"),
    (response(), FailureClass.INVALID_OUTPUT, "has no assistant message"),
    (lambda b: Response(status_code=302, headers={"location": "/elsewhere"}), FailureClass.TRANSPORT, "HTTP 302"),
])
async def test_bad_replies(tmp_path: Path, reply, failure_class: FailureClass, detail: str):
    async with serve(scripted([reply], [])) as url:
        outcome = await run(url, "http://127.0.0.1:1/v1", make_workdir(tmp_path / "w"))
    assert outcome.failure.failure_class is failure_class and detail in outcome.failure.detail, outcome.failure


async def test_a_paired_record_alone_with_a_message_finishes(tmp_path: Path):
    tools = RecordingTools(make_workdir(tmp_path / "w"))
    paired = [call("read_file", '{"path": "numbers.txt"}', "own"),
              {"type": "function_call_output", "id": "fco_own", "call_id": "own", "output": "x", "status": "completed"}]
    async with serve(scripted([response(*paired, message("<answer>1</answer>"))], [])) as url:
        outcome = await run(url, "http://127.0.0.1:1/v1", tmp_path, tools=tools)
    assert outcome.final_text == "<answer>1</answer>" and tools.ran == []


# -- configuration and the command line ------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    ({"url": "localhost:8000"}, "must be an http:// or https:// base URL"),
    ({"url": "http://h/v1"}, "without /v1"),
    ({"url": "http://h", "max_steps": 0}, "max_steps 0 must be an integer >= 1"),
    ({"url": "http://h", "connect_attempts": 0}, "connect_attempts 0"),
    ({"url": "http://h", "request_timeout_s": 0}, "request_timeout_s 0 must be a number > 0"),
    ({"url": "http://h", "model": ""}, "model '' must be a non-empty"),
])
def test_remote_agent_settings_are_checked(kwargs: dict, message: str):
    with pytest.raises(ConfigError, match=message):
        RemoteAgent(**kwargs)


def test_unknown_service_mode_is_a_config_error():
    with pytest.raises(ConfigError, match="mode 'weird' is unknown; use one of normal, malformed"):
        agent_service.create_app("weird")


def test_the_service_command_prints_its_url_once_listening():
    proc = subprocess.Popen([sys.executable, "-m", "compose.collect.agent_service", "--port", "0"],
                            stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[4])
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("agent service listening on http://127.0.0.1:")
        reply = httpx.post(line.rsplit(" ", 1)[1] + "/v1/responses", json={"input": [{}]}, timeout=5)
        assert reply.status_code == 400 and "x-tokentrail-model-base-url" in reply.json()["error"]["message"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
