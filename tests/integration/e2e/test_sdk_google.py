"""Google's own SDK (``google-genai``) through the whole pipeline, streaming and not, on both engines: a
function-calling rollout over the Gemini API (``generateContent`` / ``streamGenerateContent?alt=sse``) rebuilds
as one unmasked chain, and re-scoring by the engine reproduces every captured log-prob, bit for bit.
``countTokens`` on the same rollout's prefix records nothing (the call count is the generating calls').

The harness loop lives here, not in ``compose.harnesses.sdk``: it is this test's driver.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field

import pytest
from google import genai
from google.genai import types

from compose.harnesses.sdk import weather_tool

pytestmark = [pytest.mark.integration, pytest.mark.real_broker]

WEATHER = types.FunctionDeclaration(
    name="get_weather", description="Current weather for a city",
    parameters_json_schema={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})


@dataclass
class GoogleOutcome:
    rollout_id: str
    calls: int = 0
    counted: int = 0
    final_text: str | None = None
    final_response_id: str | None = None
    error: str | None = None
    response_ids: list[str] = field(default_factory=list)


async def run_google_rollout(base_url: str, api_key: str, rollout_id: str, prompt: str, *, stream: bool,
                             max_turns: int = 6) -> GoogleOutcome:
    """A Gemini-API harness: it owns its loop, echoes the model's content (function calls with their ids) and
    answers each call with a ``functionResponse`` of the same id, as the Gemini CLI does."""
    out = GoogleOutcome(rollout_id)
    client = genai.Client(api_key=api_key, http_options=types.HttpOptions(
        base_url=base_url, api_version="v1beta", retry_options=types.HttpRetryOptions(attempts=1)))
    config = types.GenerateContentConfig(system_instruction="You are a helpful agent. #tool-calls=2",
                                         tools=[types.Tool(function_declarations=[WEATHER])], max_output_tokens=300)
    contents = [types.Content(role="user", parts=[types.Part(text=prompt)])]
    try:
        out.counted = (await client.aio.models.count_tokens(model="gemini-2.5-flash", contents=contents)).total_tokens
        for _ in range(max_turns):
            if stream:
                chunks = [c async for c in await client.aio.models.generate_content_stream(
                    model="gemini-2.5-flash", contents=contents, config=config)]
                parts = [p for c in chunks for p in (c.candidates[0].content.parts or [])]
                response_id = chunks[-1].response_id
            else:
                answer = await client.aio.models.generate_content(model="gemini-2.5-flash", contents=contents,
                                                                  config=config)
                parts, response_id = list(answer.candidates[0].content.parts or []), answer.response_id
            out.calls += 1
            out.response_ids.append(response_id)
            text = "".join(p.text for p in parts if p.text and not p.thought)
            calls = [p.function_call for p in parts if p.function_call]
            echoed = ([types.Part(text=text)] if text else []) + [types.Part(function_call=c) for c in calls]
            contents.append(types.Content(role="model", parts=echoed))
            if not calls:
                out.final_text, out.final_response_id = text, response_id
                return out
            contents.append(types.Content(role="user", parts=[types.Part(function_response=types.FunctionResponse(
                id=c.id, name=c.name, response={"output": weather_tool(c.name, dict(c.args or {}), n)}))
                for n, c in enumerate(calls)]))
        out.error = f"no final answer in {max_turns} turns"
    except Exception as exc:  # reported, so the test names the rollout that failed
        out.error = repr(exc)
    return out


@pytest.fixture(scope="module")
def google_runs(stack):
    tag = uuid.uuid4().hex[:6]
    plan = {f"google-{'sse' if s else 'json'}-{tag}": s for s in (False, True)}

    async def run_all():
        return await asyncio.gather(*(run_google_rollout(
            stack.capture_base_url(rid).removesuffix("/v1"), stack.api_key(rid), rid,
            "What is the weather in Paris?", stream=s) for rid, s in plan.items()))

    outcomes = {o.rollout_id: o for o in asyncio.run(run_all())}
    for o in outcomes.values():
        assert o.error is None, f"{o.rollout_id}: {o.error}"
        stack.finish(o.rollout_id, {"reward": 1.0}, final_response_id=o.final_response_id, final_text=o.final_text)
    return plan, outcomes, stack.wait_rollouts(list(plan), timeout=90)


@pytest.mark.parametrize("streamed", [False, True])
def test_google_rollout_is_unmasked_and_token_exact(google_runs, stack, streamed):
    plan, outcomes, records = google_runs
    (rid,) = [r for r, s in plan.items() if s == streamed]
    rec = records[rid]
    m = rec["_ng_token_capture"]
    assert rec["mask_sample"] is False, rec["mask_reasons"]
    assert m["n_calls"] == outcomes[rid].calls == 3 and m["chains"] == 1  # countTokens recorded nothing
    assert outcomes[rid].counted > 0
    traj = rec["trajectory"]
    scored = stack.rescore(traj["token_ids"])
    assert [scored[i - 1] for i, bit in enumerate(traj["loss_mask"]) if bit] == traj["log_probs"]
