"""A sample agent service speaking the remote-agent contract: for tests, the docs, and as a template.

It stands for any agent that runs outside the collector (a NeMo Gym ``remote_agent``):
``POST /v1/responses`` takes the conversation so far and answers a Responses object
asking the collector to run tools (unpaired ``function_call`` items), recording its
own internal tools (a ``function_call`` and its ``function_call_output`` together), or
finishing with an assistant message.

Its decisions are scripted, not the model's: the tiny engines tokentrail tests with
cannot solve tasks. What matters is what a real agent does too: each step it makes
exactly one model call through ``x-tokentrail-model-base-url`` (the rollout's capture
URL, with ``x-tokentrail-model-api-key``), so the call is captured, and each call's
messages are the previous call's messages, its reply and the new tool results: one
chain. The script: step 1 lists the working directory; step 2 reads the first file of
the listing (and records an internal ``note``); step 3 answers ``The sum is
<answer>N</answer>.`` if the file holds numbers, else ``<answer>{first line}</answer>``.

Guarantees: per-rollout state lives in a session keyed by the ``tt_agent_session``
cookie it sets; a request that carries tool results but no (known) session cookie is
refused with HTTP 400 saying so, so a collector that drops cookies fails visibly.
Modes for failure tests: ``malformed`` (200, not a Responses object), ``error``
(500), ``slow`` (answers only after the client gave up), ``no_final`` (never finishes).

Run it with ``python -m compose.collect.agent_service --port P [--mode M]``; it prints
``agent service listening on http://HOST:P`` once it accepts connections.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import socket
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import openai
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from schemas.errors import ConfigError

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam

__all__ = ["create_app", "main", "MODES", "SESSION_COOKIE"]

MODES = ("normal", "malformed", "error", "slow", "no_final")
SESSION_COOKIE = "tt_agent_session"
_MAX_SESSIONS = 10_000   # oldest sessions are dropped: a sample service must not grow without bound
_SLOW_LIMIT_S = 600.0    # "slow" waits for the client to give up, but not forever


@dataclass
class _Session:
    messages: list[ChatCompletionMessageParam]  # the model's chat so far: one chain of calls
    steps: int = 0
    pending: dict[str, str] = field(default_factory=dict)  # call_id -> tool name, awaiting results
    last_result: str = ""


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "agent_service_error"}}, status_code=status)


def _id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def _call(name: str, arguments: dict[str, Any], call_id: str | None = None) -> dict[str, Any]:
    return {"type": "function_call", "id": _id("fc"), "call_id": call_id or _id("call"), "name": name,
            "arguments": json.dumps(arguments), "status": "completed"}


def _message(text: str) -> dict[str, Any]:
    return {"type": "message", "id": _id("msg"), "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def _prompt_text(items: list[Any]) -> str:
    for item in items:
        if isinstance(item, dict) and item.get("role") == "user":
            content = item.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _answer(content: str) -> str:
    """The scripted final answer: the sum of the numbers in ``content``, else its first line."""
    words = content.split()
    try:
        numbers: list[int | float] = [int(w) for w in words]
    except ValueError:
        try:
            numbers = [float(w) for w in words]
        except ValueError:
            numbers = []
    if numbers:
        return f"The sum is <answer>{sum(numbers)}</answer>."
    return f"<answer>{content.splitlines()[0] if content else ''}</answer>"


def _first_file(listing: str) -> str | None:
    if listing.startswith("error:"):
        return None
    return next((line for line in listing.splitlines() if line and not line.endswith("/")
                 and not line.startswith("[")), None)


def _script(mode: str, session: _Session) -> list[dict[str, Any]]:
    """What this step's reply asks for: the agent's (scripted) decision."""
    if mode == "no_final" or session.steps == 1:
        return [_call("list_files", {"path": "."})]
    if session.steps == 2:
        name = _first_file(session.last_result)
        if name is None:
            return [_message("There is no file to read.")]
        note_id = _id("call")
        return [_call("note", {"text": f"reading {name}"}, note_id),
                {"type": "function_call_output", "id": _id("fco"), "call_id": note_id,
                 "output": "noted", "status": "completed"},
                _call("read_file", {"path": name})]
    return [_message(_answer(session.last_result))]


def create_app(mode: str = "normal") -> Starlette:
    """The service's ASGI app; ``mode`` is one of ``MODES``. Its sessions are ``app.state.sessions``."""
    if mode not in MODES:
        raise ConfigError(f"agent service mode {mode!r} is unknown; use one of {', '.join(MODES)}")
    sessions: OrderedDict[str, _Session] = OrderedDict()

    async def responses(request: Request) -> JSONResponse:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the body must be a JSON Responses request")
        if not isinstance(body, dict) or not isinstance(body.get("input"), list):
            return _error(400, "the body must be a JSON object whose 'input' is a list of items")
        if mode == "error":
            return _error(500, "agent service in mode 'error': injected failure")
        if mode == "malformed":
            return JSONResponse({"output": "nope"})
        if mode == "slow":
            deadline = time.monotonic() + _SLOW_LIMIT_S
            # Polls for the disconnect so a server shutting down is not held up by a sleeping handler.
            while time.monotonic() < deadline and not await request.is_disconnected():
                await asyncio.sleep(0.05)
            return _error(503, "agent service in mode 'slow': answered too late")

        results = [i for i in body["input"] if isinstance(i, dict) and i.get("type") == "function_call_output"]
        key = request.cookies.get(SESSION_COOKIE)
        session = sessions.get(key) if key else None
        if session is None:
            if results:
                why = f"an unknown {SESSION_COOKIE} cookie" if key else f"no {SESSION_COOKIE} cookie"
                return _error(400, f"this request carries function_call_output items but {why}: the service "
                                   f"keeps each rollout's state in a session; send back the cookie it set "
                                   f"(one cookie jar per rollout)")
            key, session = secrets.token_hex(16), _Session(messages=[{"role": "user",
                                                                       "content": _prompt_text(body["input"])}])
            sessions[key] = session
            while len(sessions) > _MAX_SESSIONS:
                sessions.popitem(last=False)
        assert key is not None  # the session's: the cookie's, or the new one's
        sessions.move_to_end(key)
        answered = {i.get("call_id"): i for i in results if i.get("call_id") in session.pending}
        if session.pending.keys() - answered.keys():
            return _error(400, f"missing function_call_output for call_id(s) "
                               f"{sorted(session.pending.keys() - answered.keys())}")
        # Committed only once the model answered: a failed step leaves the session as it was.
        messages, last_result = list(session.messages), session.last_result
        for call_id, name in session.pending.items():
            last_result = str(answered[call_id].get("output", ""))
            messages.append({"role": "user", "content": f"Tool {name} returned: {last_result}"})

        base_url = request.headers.get("x-tokentrail-model-base-url")
        if not base_url:
            return _error(400, "header x-tokentrail-model-base-url is missing: the service makes its model "
                               "calls there (the rollout's capture URL)")
        client = openai.AsyncOpenAI(base_url=base_url, max_retries=0, timeout=60.0,
                                    api_key=request.headers.get("x-tokentrail-model-api-key") or "none")
        try:
            completion = await client.chat.completions.create(model=str(body.get("model", "")), messages=messages)
        except openai.OpenAIError as exc:
            return _error(502, f"the model call to {base_url} failed: {type(exc).__name__}: {exc}")
        finally:
            await client.close()
        messages.append({"role": "assistant", "content": completion.choices[0].message.content or ""})
        session.messages, session.last_result, session.steps = messages, last_result, session.steps + 1

        output = _script(mode, session)
        answered_here = {i["call_id"] for i in output if i["type"] == "function_call_output"}
        session.pending = {i["call_id"]: i["name"] for i in output
                           if i["type"] == "function_call" and i["call_id"] not in answered_here}
        reply = JSONResponse({
            "id": _id("resp_agent"), "object": "response", "created_at": time.time(),
            "model": str(body.get("model", "")), "status": "completed", "output": output,
            "parallel_tool_calls": False, "tool_choice": "auto", "tools": [], "error": None,
            "incomplete_details": None,
        })
        reply.set_cookie(SESSION_COOKIE, key, httponly=True, samesite="lax")
        return reply

    app = Starlette(routes=[Route("/v1/responses", responses, methods=["POST"])])
    app.state.sessions = sessions
    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m compose.collect.agent_service", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--mode", choices=MODES, default="normal")
    parser.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    args = parser.parse_args(argv)
    import uvicorn

    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    # Bound before uvicorn starts, so --port 0 gets a free port we can print.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as exc:
        sock.close()
        print(f"agent service: cannot bind {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    host = f"[{args.host}]" if family == socket.AF_INET6 else args.host
    url = f"http://{host}:{sock.getsockname()[1]}"

    class _Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if not self.should_exit:
                print(f"agent service listening on {url}", flush=True)

    config = uvicorn.Config(create_app(args.mode), log_level=args.log_level, access_log=False, lifespan="off")
    _Server(config).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
