"""Google's own SDK (``google-genai``) through the interceptor on the reference policy: ``generateContent``,
``streamGenerateContent`` with a function-calling round trip, and ``countTokens``. Every generating call is
captured with exact tokens, parents resolve across the Gemini echo, response ids name the calls, no token
field reaches the client, and counting records nothing."""

from __future__ import annotations

import httpx
import pytest
from google import genai
from google.genai import errors, types

from schemas.ids import call_id_from_response_id
from schemas.records import CallCaptured, Dialect, ParentResolution
from tests.unit.producers.conftest import captured
from tests.unit.producers.dialects.conftest import assert_clean

MODEL = "gemini-2.5-flash"
SHELL = types.FunctionDeclaration(
    name="run_shell_command", description="Run a shell command",
    parameters_json_schema={"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]})
# The same tool as Gemini's own Schema (upper-case types): translated to JSON Schema for the engine.
READ = types.FunctionDeclaration(
    name="read_file", description="Read a file",
    parameters=types.Schema(type=types.Type.OBJECT, properties={"path": types.Schema(type=types.Type.STRING)},
                            required=["path"]))


def client(app, rollout: str, seen: list | None = None) -> genai.Client:
    async def record(response: httpx.Response) -> None:
        if seen is not None:
            await response.aread()
            seen.append(response)

    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), event_hooks={"response": [record]})
    return genai.Client(api_key="x", http_options=types.HttpOptions(
        base_url=f"http://tt/ng-rollout/{rollout}/training-token-capture", httpx_async_client=http,
        retry_options=types.HttpRetryOptions(attempts=1)))


async def run_session(sdk: genai.Client, *, stream: bool) -> list[types.GenerateContentResponse]:
    """A function-calling round trip: the policy calls the shell tool twice, then answers."""
    config = types.GenerateContentConfig(system_instruction="You are an agent. #tool-calls=2", tools=[
        types.Tool(function_declarations=[SHELL, READ])], temperature=1.0, top_p=0.95, top_k=64)
    contents: list[types.Content] = [types.Content(role="user", parts=[types.Part(text="List the files.")])]
    finals = []
    for _ in range(4):
        if stream:
            chunks = [c async for c in await sdk.aio.models.generate_content_stream(
                model=MODEL, contents=contents, config=config)]
            final = merged(chunks)
        else:
            final = await sdk.aio.models.generate_content(model=MODEL, contents=contents, config=config)
        finals.append(final)
        content = final.candidates[0].content
        contents.append(content)
        calls = [p.function_call for p in content.parts if p.function_call]
        if not calls:
            break
        contents.append(types.Content(role="user", parts=[
            types.Part(function_response=types.FunctionResponse(id=c.id, name=c.name, response={"output": "a.txt b.txt"}))
            for c in calls]))
    return finals


def merged(chunks: list[types.GenerateContentResponse]) -> types.GenerateContentResponse:
    """The stream as one response, the way the Gemini CLI keeps it: text parts merged, calls as they came."""
    parts: list[types.Part] = []
    for chunk in chunks:
        for part in chunk.candidates[0].content.parts or []:
            if part.text is not None and parts and parts[-1].text is not None:
                parts[-1] = types.Part(text=parts[-1].text + part.text)
            else:
                parts.append(part)
    last = chunks[-1]
    assert all(c.response_id == last.response_id for c in chunks)
    return types.GenerateContentResponse(
        candidates=[types.Candidate(content=types.Content(role="model", parts=parts),
                                    finish_reason=last.candidates[0].finish_reason)],
        usage_metadata=last.usage_metadata, response_id=last.response_id, model_version=last.model_version)


def assert_chain(calls: list[CallCaptured]) -> None:
    assert len(calls) == 3
    assert calls[0].parent_resolution is ParentResolution.ROOT
    for parent, child in zip(calls, calls[1:]):
        assert child.parent_resolution is ParentResolution.RESOLVED, child.parent_resolution_reason
        assert child.parent_call_id == parent.model_call_id and child.prompt_is_delta
    assert all(c.facts.dialect is Dialect.GOOGLE_GENERATE_CONTENT and c.facts.requested_model == MODEL for c in calls)
    assert all(c.facts.served_model == "tokentrail-policy" for c in calls)


@pytest.mark.parametrize("stream", [False, True])
async def test_google_sdk_function_calling_round_trip(policy_app, publisher, stream):
    seen: list[httpx.Response] = []
    finals = await run_session(client(policy_app, f"g-{stream}", seen), stream=stream)
    assert [f.candidates[0].finish_reason for f in finals] == [types.FinishReason.STOP] * 3
    for final in finals[:2]:
        (call,) = [p.function_call for p in final.candidates[0].content.parts if p.function_call]
        assert call.name == "run_shell_command" and set(call.args) == {"command"} and call.id
    assert finals[-1].text and not finals[-1].function_calls
    calls = captured(publisher)
    assert_chain(calls)
    assert all(c.facts.streamed is stream for c in calls)
    assert [call_id_from_response_id(f.response_id) for f in finals] == [c.model_call_id for c in calls]
    assert finals[0].usage_metadata.prompt_token_count == len(calls[0].prompt_token_ids)  # later prompts: deltas
    for final, call in zip(finals, calls):
        assert final.model_version == MODEL
        assert final.usage_metadata.candidates_token_count == len(call.generation_token_ids)
    assert len(seen) == 3 and all(r.status_code == 200 for r in seen)
    for response in seen:
        assert_clean(response.json() if not stream else [line for line in response.text.splitlines() if line])
        assert b"token_ids" not in response.content and b"logprobs" not in response.content


async def test_streamed_equals_non_streamed(policy_app, publisher):
    plain = await run_session(client(policy_app, "g-plain"), stream=False)
    streamed = await run_session(client(policy_app, "g-stream"), stream=True)

    def shape(response: types.GenerateContentResponse) -> list:
        # tool-call ids are the engine's, random per call; everything else must match
        return [(p.text, p.function_call.name if p.function_call else None,
                 p.function_call.args if p.function_call else None) for p in response.candidates[0].content.parts] + [
            response.candidates[0].finish_reason, response.usage_metadata.total_token_count]

    assert [shape(r) for r in plain] == [shape(r) for r in streamed]


async def test_count_tokens_answers_the_rendered_prompt_and_records_nothing(policy_app, publisher):
    sdk = client(policy_app, "g-count")
    contents = [types.Content(role="user", parts=[types.Part(text="List the files.")])]
    counted = await sdk.aio.models.count_tokens(model=MODEL, contents=contents)
    assert publisher.events == []  # no intent, no capture: counting never records
    await sdk.aio.models.generate_content(model=MODEL, contents=contents)
    (call,) = captured(publisher)
    assert counted.total_tokens == len(call.prompt_token_ids)


async def test_a_bad_request_is_a_400_in_googles_shape_and_records_nothing(policy_app, publisher):
    sdk = client(policy_app, "g-bad")
    config = types.GenerateContentConfig(candidate_count=2)
    with pytest.raises(errors.ClientError) as caught:
        await sdk.aio.models.generate_content(model=MODEL, contents="hi", config=config)
    assert caught.value.code == 400 and caught.value.status == "INVALID_ARGUMENT"
    assert "candidateCount" in caught.value.message and "one candidate" in caught.value.message
    assert publisher.events == []


async def raw(app, path: str, body: dict, rollout: str = "g-raw") -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://tt") as http:
        return await http.post(f"/ng-rollout/{rollout}/training-token-capture{path}", json=body)


HELLO = {"contents": [{"role": "user", "parts": [{"text": "Say hello."}]}]}


async def test_a_stream_without_alt_sse_is_a_400_and_records_nothing(policy_app, publisher):
    r = await raw(policy_app, f"/v1beta/models/{MODEL}:streamGenerateContent", HELLO)
    assert r.status_code == 400 and r.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert "alt=sse" in r.json()["error"]["message"]
    assert publisher.events == []


async def test_the_facts_name_the_model_of_the_path_and_the_budget_of_generation_config(policy_app, publisher):
    r = await raw(policy_app, f"/v1beta/models/{MODEL}:generateContent", {**HELLO, "generationConfig": {"maxOutputTokens": 40}})
    assert r.status_code == 200, r.text
    (call,) = captured(publisher)
    assert (call.facts.requested_model, call.facts.max_tokens, call.facts.route) == (
        MODEL, 40, f"/v1beta/models/{MODEL}:generateContent")
    assert call_id_from_response_id(r.json()["responseId"]) == call.model_call_id


@pytest.mark.parametrize("prefix", ["", "/ng-rollout/g-eval", "/ng-rollout/g-cap/training-token-capture"])
async def test_count_tokens_records_nothing_on_any_prefix(policy_app, publisher, prefix):
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=policy_app), base_url="http://tt") as http:
        r = await http.post(f"{prefix}/v1beta/models/{MODEL}:countTokens", json=HELLO)
        bad = await http.post(f"{prefix}/v1beta/models/{MODEL}:countTokens", json={"contents": "nope"})
    assert r.status_code == 200 and r.json()["totalTokens"] > 0
    assert bad.status_code == 400 and bad.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert publisher.events == []


async def test_an_engine_error_is_in_googles_shape(policy_app, publisher):
    r = await raw(policy_app, f"/v1beta/models/{MODEL}:generateContent", {**HELLO, "generationConfig": {"temperature": -5}})
    assert r.status_code == 400, r.text
    assert set(r.json()["error"]) == {"code", "message", "status"} and r.json()["error"]["code"] == 400


def test_a_stream_error_event_is_a_google_error_chunk(policy_app):
    adapter = policy_app.adapters["google"]
    parsed = adapter.parse(HELLO, api_path=f"/v1beta/models/{MODEL}:streamGenerateContent", query="alt=sse")
    event = adapter.stream_adapter("gen_ttx", parsed).error(503, "the capture is not durable")
    assert event == b'data: {"error":{"code":503,"message":"the capture is not durable","status":"UNAVAILABLE"}}\n\n'
