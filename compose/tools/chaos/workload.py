"""The chaos workload: N concurrent multi-call agent rollouts driven through the interceptor.

Each rollout is an OpenAI-SDK tool-calling loop (the reference engine's ``#tool-calls=K``
directive makes it call the weather tool K times, then answer), against
``LocalStack.capture_base_url(rid)``, then ``finish`` with a deterministic result. What a
rollout sends depends only on its index (task text, K, streaming or not), and the reference
engine is deterministic per prompt, so the same workload gives the same token ids in every
run: a clean run is the baseline of a faulted one.

What the driver does when a call fails (documented in docs/contributing.md, "Chaos under load"): what
any SDK harness does with its default retries, without a retry limit inside the run's deadline.

- **retried**: a refused or broken connection (nothing answered, or a stream cut before its
  end: ``openai.APIConnectionError``), a timeout, and a 5xx answer (the interceptor's 503
  "not durable" included). The same request is sent again, so a retried call asks the engine
  the same thing and, the engine being deterministic, gets the same tokens. Every failed
  attempt is counted in ``failed_attempts``. A failed attempt the interceptor had already
  made durable as an intent (CallStarted on the log, so the engine may have sampled for it)
  without a capture must leave the rollout masked; one that never got that far left nothing
  and the rollout must come out as in a clean run (``compose.tools.chaos.accounting``).
- **not retried**: any other answer (a 4xx), or the deadline passed: the harness loop ends
  there with ``failure`` set, as a harness errors out of its rollout; the rollout is still
  finished (its result says ``harness_error``).

The finish is retried the same way (the same payload freezes the same snapshot).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai

from compose.harnesses.sdk import WEATHER_TOOL, weather_tool
from compose.rig.stack import LocalStack
from schemas.errors import TokentrailError
from schemas.ids import call_id_from_response_id

__all__ = ["ChaosError", "Progress", "RolloutRun", "Workload", "drive"]

_CITIES = ("Lisbon", "Oslo", "Lima", "Hanoi", "Quito", "Accra", "Perth", "Turin")
_RETRY_S = 0.25


class ChaosError(TokentrailError, RuntimeError):
    """The chaos run itself could not go on (a refused finish, a service that did not come back)."""


@dataclass(frozen=True, slots=True)
class Workload:
    rollouts: int = 64
    stream_every: int = 2  # rollout i streams when i % stream_every == 0 (0: none stream)
    think_s: float = 0.05  # the tool's run time between two calls of a rollout
    call_timeout_s: float = 120.0  # one model call, as the SDK client bounds it
    deadline_s: float = 300.0  # connection retries and finish retries give up after this

    def tool_calls(self, index: int) -> int:
        return 1 + index % 3  # 2 to 4 model calls per rollout

    def streams(self, index: int) -> bool:
        return self.stream_every > 0 and index % self.stream_every == 0

    def task(self, index: int) -> str:
        return f"What is the weather in {_CITIES[index % len(_CITIES)]}? (task {index})"

    def result(self, index: int) -> dict[str, Any]:
        return {"reward": (index % 5) / 4, "task": index}


@dataclass(slots=True)
class RolloutRun:
    """What the harness of one rollout saw."""

    index: int
    rollout_id: str
    acked: list[str] = field(default_factory=list)  # model call ids answered 2xx, in order
    failure: str | None = None  # a call given up on (4xx, deadline): the loop ended there
    failed_attempts: int = 0  # attempts that failed and were retried
    finished: bool = False
    final_response_id: str | None = None


@dataclass(slots=True)
class Progress:
    """Live counters the fault injectors wait on."""

    acked: int = 0  # calls answered 2xx so far, all rollouts
    streaming: int = 0  # streams past their first chunk and not yet complete
    done: int = 0  # rollouts finished
    failed: int = 0  # attempts that failed (a 5xx or a broken connection, retried) or ended their rollout
    calls: list[tuple[float, float]] = field(default_factory=list)  # (answered at, seconds) of each answered attempt


async def drive(stack: LocalStack, prefix: str, workload: Workload, progress: Progress) -> list[RolloutRun]:
    """Run every rollout of ``workload`` concurrently as ``<prefix>-<i>``; each is finished when its loop ends."""
    runs = [RolloutRun(i, f"{prefix}-{i}") for i in range(workload.rollouts)]
    async with httpx.AsyncClient(timeout=30) as control:
        await asyncio.gather(*(_rollout(stack, control, workload, run, progress) for run in runs))
    return runs


async def _rollout(stack: LocalStack, control: httpx.AsyncClient, workload: Workload, run: RolloutRun,
                   progress: Progress) -> None:
    deadline = time.monotonic() + workload.deadline_s
    client = openai.AsyncOpenAI(base_url=stack.capture_base_url(run.rollout_id), api_key=stack.api_key(run.rollout_id),
                                max_retries=0, timeout=workload.call_timeout_s)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": f"You are a helpful agent. #tool-calls={workload.tool_calls(run.index)}"},
        {"role": "user", "content": workload.task(run.index)},
    ]
    final_text: str | None = None
    try:
        for _ in range(workload.tool_calls(run.index) + 2):
            response = await _call(client, messages, workload.streams(run.index), run, progress, deadline)
            if response is None:
                break
            run.acked.append(call_id_from_response_id(response.id) or response.id)
            progress.acked += 1
            message = response.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                final_text, run.final_response_id = message.content, response.id
                break
            for call in message.tool_calls:
                await asyncio.sleep(workload.think_s)
                output = weather_tool(call.function.name, json.loads(call.function.arguments or "{}"), len(messages))
                messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
        else:
            run.failure = "no final answer"
    finally:
        await client.close()
    result = workload.result(run.index) | ({"harness_error": run.failure} if run.failure else {})
    await _finish(stack, control, run, result, final_text, deadline)
    progress.done += 1


async def _call(client: openai.AsyncOpenAI, messages: list[dict[str, Any]], stream: bool, run: RolloutRun,
                progress: Progress, deadline: float) -> Any | None:
    """One model call, retried while the fault lasts: its completion, or None after recording the failure."""
    kwargs: dict[str, Any] = dict(model="tokentrail-policy", messages=messages, tools=[WEATHER_TOOL])
    while True:
        started = time.monotonic()
        try:
            if not stream:
                answer = await client.chat.completions.create(**kwargs)
            else:
                async with client.chat.completions.stream(**kwargs) as s:
                    counted = False
                    try:
                        async for _event in s:
                            if not counted:
                                counted, progress.streaming = True, progress.streaming + 1
                        answer = await s.get_final_completion()
                    finally:
                        if counted:
                            progress.streaming -= 1
            now = time.monotonic()
            progress.calls.append((now, now - started))
            return answer
        except (openai.APIConnectionError, openai.InternalServerError) as exc:  # timeouts are connection errors
            why = f"{type(exc).__name__}: {exc.__cause__!r}" if exc.__cause__ else f"{type(exc).__name__}: {exc}"
            if time.monotonic() >= deadline:
                run.failure = f"deadline passed, last attempt: {why}"[:300]
                return None
            run.failed_attempts += 1
            progress.failed += 1
            await asyncio.sleep(_RETRY_S)
        except openai.APIError as exc:
            run.failure = f"{type(exc).__name__}: {str(exc)[:200]}"
            progress.failed += 1
            return None


async def _finish(stack: LocalStack, control: httpx.AsyncClient, run: RolloutRun, result: dict[str, Any],
                  final_text: str | None, deadline: float) -> None:
    """POST the finish, retried until it is acknowledged: the same payload freezes the same snapshot."""
    url = f"{stack.interceptor_url}/rollouts/{run.rollout_id}/finish"
    body = {"result": result, "final_response_id": run.final_response_id, "final_text": final_text}
    headers = {"authorization": f"Bearer {stack.control_token}"}
    while time.monotonic() < deadline:
        try:
            r = await control.post(url, json=body, headers=headers)
            if r.status_code < 300:
                run.finished = True
                return
            if r.status_code < 500:
                raise ChaosError(f"finish of {run.rollout_id} refused: {r.status_code} {r.text[:200]}")
        except httpx.TransportError:
            pass
        await asyncio.sleep(_RETRY_S)
