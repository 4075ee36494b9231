"""Drive a remote agent service over the OpenAI Responses contract (NeMo Gym's ``remote_agent``).

The agent runs outside the collector's process tree. Each step the collector POSTs
``{url}/v1/responses`` with the conversation so far (the task's prompt as a user
message, then every output item of earlier replies and the ``function_call_output``
items the collector produced) and reads back a Responses object:

* an unpaired ``function_call`` (no ``function_call_output`` with its ``call_id`` in
  the same reply) asks the collector to run a tool; the collector runs it in the
  rollout's ``ToolSet`` and sends its output on the next step;
* a paired call and output is a record of the service's own internal tool: passed
  through into the conversation untouched, never executed;
* no unpaired call and an assistant ``message`` is the final answer.

Guarantees:

* ``drive`` never raises (except on cancellation): every failure is a
  ``HarnessOutcome`` whose ``Failure`` has its class. A reply that is not JSON or not a
  valid Responses object is ``SCHEMA`` (terminal: the same service gives the same
  reply); ``status`` other than completed, or no final message, is ``INVALID_OUTPUT``;
  ``max_steps`` POSTs without a final message is ``MAX_STEPS``; connection refused or
  a server that disconnects is tried ``connect_attempts`` times in all, then
  ``TRANSPORT``; any HTTP status outside 2xx is ``TRANSPORT`` with the status and the
  body's start; a request past ``request_timeout_s`` is ``TIMEOUT``, not retried.
* Tool errors (unknown tool, bad argument JSON, a tool that raises, a path outside the
  working directory) are not rollout failures: they go back as that call's output.
* One HTTP client, so one cookie jar, per rollout: the service's per-rollout session
  cookies round-trip and never leak into another rollout.
* The service is told where to make its model calls (``x-tokentrail-model-base-url``,
  the rollout's capture URL) so that every call it makes is captured.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

import httpx
from pydantic import ValidationError

from compose.collect.outcome import FailureClass, HarnessOutcome
from schemas.errors import ConfigError, TokentrailError

if TYPE_CHECKING:
    from compose.collect.tasks import Task
    from compose.collect.tools import ToolSet

__all__ = ["RemoteAgent", "drive", "ROLLOUT_HEADER", "MODEL_BASE_URL_HEADER", "MODEL_API_KEY_HEADER"]

ROLLOUT_HEADER = "x-tokentrail-rollout-id"
MODEL_BASE_URL_HEADER = "x-tokentrail-model-base-url"
MODEL_API_KEY_HEADER = "x-tokentrail-model-api-key"

_BACKOFF_S = 0.2      # before the 2nd attempt; doubled before each later one
_BODY_PREVIEW = 300   # characters of an error body kept in a failure's detail


@cache
def _response_model() -> Any:
    try:
        from openai.types.responses import Response
    except ImportError as exc:
        raise ConfigError(f"the remote agent driver validates replies with the openai package's Responses "
                          f"schema, which is not installed ({exc}); pip install 'openai==3.57.0'") from exc
    return Response


@dataclass(frozen=True)
class RemoteAgent:
    """Where the agent service is and how patiently to drive it. Checked on construction (``ConfigError``)."""

    url: str  # the service's base URL; requests go to {url}/v1/responses
    max_steps: int = 16
    request_timeout_s: float = 120.0
    connect_attempts: int = 3
    model: str = "tokentrail-policy"

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"remote agent url {self.url!r} must be an http:// or https:// base URL")
        if self.url.rstrip("/").endswith(("/v1", "/v1/responses")):
            raise ConfigError(f"remote agent url {self.url!r} must be the service's base URL, without /v1 "
                              f"(requests go to {{url}}/v1/responses); drop the suffix")
        for field, value, low in (("max_steps", self.max_steps, 1), ("connect_attempts", self.connect_attempts, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ConfigError(f"remote agent {field} {value!r} must be an integer >= {low}")
        if not isinstance(self.request_timeout_s, (int, float)) or not self.request_timeout_s > 0:
            raise ConfigError(f"remote agent request_timeout_s {self.request_timeout_s!r} must be a number > 0")
        if not isinstance(self.model, str) or not self.model:
            raise ConfigError(f"remote agent model {self.model!r} must be a non-empty model name")
        _response_model()  # a missing dependency fails at start-up, not at the first reply

    @property
    def endpoint(self) -> str:
        return self.url.rstrip("/") + "/v1/responses"


class _Failed(TokentrailError):
    def __init__(self, failure_class: FailureClass, detail: str) -> None:
        super().__init__(detail)
        self.failure_class, self.detail = failure_class, detail


async def drive(agent: RemoteAgent, *, task: Task, rollout_id: str, tools: ToolSet, model_base_url: str,
                model_api_key: str, transport: httpx.AsyncBaseTransport | None = None) -> HarnessOutcome:
    """Run one rollout of ``task`` on the service; the outcome says what it ended with. Never raises.

    ``transport`` replaces httpx's default (tests count connection attempts with it).
    """
    steps = 0
    try:
        conversation = _opening(task.prompt)
        definitions = tools.definitions()
        headers = {ROLLOUT_HEADER: rollout_id, MODEL_BASE_URL_HEADER: model_base_url,
                   MODEL_API_KEY_HEADER: model_api_key}
        async with httpx.AsyncClient(transport=transport, headers=headers, follow_redirects=False,
                                     timeout=httpx.Timeout(agent.request_timeout_s)) as client:
            while steps < agent.max_steps:
                steps += 1
                body = {"model": agent.model, "input": conversation, "tools": definitions, "store": False}
                raw = await _post(client, agent, body, steps)
                response = _validate(raw, steps)
                calls = _unpaired_calls(response)
                # Raw items, not re-dumped models: the service gets back exactly what it sent.
                conversation.extend(raw["output"])
                if not calls:
                    return _final(response, steps)
                for call in calls:
                    # A task tool may block (its author's code); other rollouts keep running.
                    output = await asyncio.to_thread(tools.call, call.name, call.arguments)
                    conversation.append({"type": "function_call_output", "call_id": call.call_id, "output": output})
            return HarnessOutcome.failed(
                FailureClass.MAX_STEPS, f"no final message from {agent.endpoint} within max_steps={agent.max_steps} "
                f"requests (the last asked for {', '.join(c.name for c in calls)}); raise --max-steps or "
                f"check the agent", steps=steps)
    except _Failed as failed:
        return HarnessOutcome.failed(failed.failure_class, failed.detail, steps=steps)
    except Exception as exc:  # a bug here must cost one rollout, not the collection
        return HarnessOutcome.failed(FailureClass.HARNESS_CRASH,
                                     f"remote agent driver failed at step {steps}: {type(exc).__name__}: {exc}",
                                     steps=steps)


def _opening(prompt: str | Sequence[Any]) -> list[Any]:
    if isinstance(prompt, str):
        return [{"type": "message", "role": "user", "content": prompt}]
    # A prompt given as input items (a system message first, say) is sent as it is.
    return list(prompt)


async def _post(client: httpx.AsyncClient, agent: RemoteAgent, body: dict[str, Any], step: int) -> Any:
    where = f"POST {agent.endpoint} (step {step})"
    for attempt in range(1, agent.connect_attempts + 1):
        try:
            # httpx's timeout is per read; this bounds a service that trickles bytes too.
            async with asyncio.timeout(agent.request_timeout_s):
                reply = await client.post(agent.endpoint, json=body)
        except (httpx.TimeoutException, TimeoutError) as exc:
            raise _Failed(FailureClass.TIMEOUT, f"{where}: no reply within request_timeout_s="
                                                f"{agent.request_timeout_s} ({type(exc).__name__})") from exc
        except (httpx.ConnectError, httpx.RemoteProtocolError) as exc:
            # Refused or dropped before a reply: the service may be restarting; try again shortly.
            if attempt == agent.connect_attempts:
                raise _Failed(FailureClass.TRANSPORT, f"{where}: {type(exc).__name__}: {exc or 'no reply'} "
                                                      f"after {attempt} connection attempts; is the agent "
                                                      f"service running at {agent.url}?") from exc
            await asyncio.sleep(_BACKOFF_S * 2 ** (attempt - 1))
            continue
        except httpx.HTTPError as exc:
            raise _Failed(FailureClass.TRANSPORT, f"{where}: {type(exc).__name__}: {exc}") from exc
        break
    if not 200 <= reply.status_code < 300:
        # Redirects are not followed: a 3xx means a wrong URL, as a 4xx does.
        raise _Failed(FailureClass.TRANSPORT, f"{where} answered HTTP {reply.status_code}: "
                                              f"{reply.text[:_BODY_PREVIEW]!r}")
    try:
        return reply.json()
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise _Failed(FailureClass.SCHEMA, f"{where}: the reply is not JSON ({exc}): "
                                           f"{reply.text[:_BODY_PREVIEW]!r}") from exc


def _validate(raw: Any, step: int) -> Any:
    try:
        response = _response_model().model_validate(raw)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        location = ".".join(str(part) for part in first["loc"]) or "(the reply)"
        raise _Failed(FailureClass.SCHEMA, f"reply to step {step} is not a valid Responses object: at "
                                           f"{location}: {first['msg']} ({exc.error_count()} error(s)); fix "
                                           f"the agent service's reply") from exc
    if response.status not in (None, "completed"):
        reason = (response.error.message if response.error else None) or (
            response.incomplete_details.reason if response.incomplete_details else None) or "no reason given"
        raise _Failed(FailureClass.INVALID_OUTPUT, f"reply {response.id} to step {step} has status "
                                                   f"{response.status!r}: {reason}")
    return response


def _unpaired_calls(response: Any) -> list[Any]:
    answered = {item.call_id for item in response.output if item.type == "function_call_output"}
    return [item for item in response.output if item.type == "function_call" and item.call_id not in answered]


def _final(response: Any, steps: int) -> HarnessOutcome:
    if not any(item.type == "message" for item in response.output):
        kinds = ", ".join(sorted({item.type for item in response.output})) or "no items"
        return HarnessOutcome.failed(FailureClass.INVALID_OUTPUT, f"reply {response.id} asks for no tool call "
                                     f"and has no assistant message (output: {kinds})", steps=steps)
    return HarnessOutcome(final_text=response.output_text, final_response_id=response.id, steps=steps)
