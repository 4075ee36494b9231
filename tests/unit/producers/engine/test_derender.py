"""vLLM 0.34's token-in stream for prefix supply, the pure part: which route a call takes, the request it
sends, and each derendered chunk as the chat chunk the stream path reads.

Proves: the route is the generate route only for a streamed call with supplied ids on an engine that
offered it; the request is the render's GenerateRequest with the supplied ids in, streamed, derendered,
reporting its prompt ids, and a render answer of another shape is refused naming the field; a chunk's
token fields reach the chat chunk as the very objects the engine sent (bit-exact) and ``read_chunk``
reads it as a chat chunk; a chunk whose ids are missing or whose log-probs do not pair one-to-one with
its ids is refused (the call is masked), never patched; the translation costs the same Python calls
whatever the chunk's token count; the module imports the standard library only.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from producers.dialects.chat_chunks import read_chunk
from producers.engine.derender import DerenderChunks, DerenderError, generate_request, route_for
from schemas.records import PrefixRoute

RENDERED = {"request_id": "chatcmpl-r", "token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 9, "logprobs": 0},
            "parse_context": {"tools": None}, "output_mode": "tokens", "stream": True, "return_token_ids": None,
            "kv_transfer_params": None, "cache_salt": "s"}


def _entry(t: int) -> dict[str, Any]:
    return {"token": f"t{t}", "logprob": -0.1 * t - 1e-9, "bytes": [116], "top_logprobs": []}


def _chunk(ids: list[int] | None, *, finish: str | None = None, first: bool = False, **choice: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"request_id": "generate-tokens-x", "usage": None}
    if first:
        body["prompt_token_ids"] = [1, 2, 3]
    c = {"index": 0, "finish_reason": finish, "stop_reason": None, "token_ids": ids, "routed_experts": None,
         "sampling_mask": None, "weight_versions": [{"version": "v1", "start": 0, "end": 2}] if finish else None,
         "delta": {"role": "assistant" if first else None, "content": "hi", "reasoning": None},
         "logprobs": {"content": [_entry(t) for t in ids or ()]}}
    c.update(choice)
    return {**body, "output_mode": "derender", "choices": [c]}


def test_the_module_imports_the_stdlib_only():
    code = ("import json, sys; before = set(sys.modules); import producers.engine.derender\n"
            "new = {m.split('.')[0] for m in set(sys.modules) - before}\n"
            "print(json.dumps(sorted(new - set(sys.stdlib_module_names))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[4], capture_output=True,
                         text=True, check=True)
    assert set(json.loads(out.stdout.strip().splitlines()[-1])) <= {"producers", "schemas"}


@pytest.mark.parametrize(("supplied", "streamed", "offered", "route"), [
    (True, True, True, PrefixRoute.GENERATE),
    (True, True, False, PrefixRoute.CHAT),  # a 0.32/0.33 engine: kv_transfer_params on the chat route
    (True, False, True, PrefixRoute.CHAT),  # not streamed: the chat route, whatever the engine offers
    (False, True, True, PrefixRoute.NONE),
])
def test_only_a_streamed_call_with_supplied_ids_on_an_engine_that_offers_it_takes_the_generate_route(
        supplied, streamed, offered, route):
    assert route_for(supplied, streamed, offered) is route


def test_the_request_is_the_renders_with_the_supplied_ids_streamed_and_derendered():
    ids = [1, 2, 3, 40, 41]
    out = generate_request(RENDERED, ids, include_usage=True)
    assert out["token_ids"] is ids and out["sampling_params"] == RENDERED["sampling_params"]
    assert (out["output_mode"], out["stream"], out["return_token_ids"]) == ("derender", True, True)
    assert out["stream_options"] == {"include_usage": True, "continuous_usage_stats": False}
    assert out["parse_context"] == RENDERED["parse_context"] and out["cache_salt"] == "s"
    assert RENDERED["token_ids"] == [1, 2, 3]  # the render's answer is not changed


@pytest.mark.parametrize("rendered,field", [([1], "GenerateRequest"),
                                            ({**RENDERED, "parse_context": None}, "'parse_context'"),
                                            ({**RENDERED, "sampling_params": "x"}, "'sampling_params'")])
def test_a_render_answer_of_another_shape_is_refused_naming_the_field(rendered, field):
    with pytest.raises(ValueError, match=field) as info:
        generate_request(rendered, [1], include_usage=False)
    assert "vLLM >= 0.34" in str(info.value)


def test_a_chunk_becomes_a_chat_chunk_with_the_engines_own_token_objects():
    chunk = _chunk([5, 6], first=True)
    source = chunk["choices"][0]
    ids, logprobs, prompt = source["token_ids"], source["logprobs"], chunk["prompt_token_ids"]
    out = DerenderChunks("cid", "policy", 7).chat_chunk(chunk)
    assert {k: out[k] for k in ("id", "object", "created", "model")} == {
        "id": "cid", "object": "chat.completion.chunk", "created": 7, "model": "policy"}
    choice = out["choices"][0]
    assert choice["token_ids"] is ids and choice["logprobs"] is logprobs and out["prompt_token_ids"] is prompt
    assert not {"sampling_mask", "routed_experts"} & set(choice) and "output_mode" not in out
    read = read_chunk(out)
    assert (read.text, read.token_ids, read.logprobs, read.prompt_token_ids) == ("hi", [5, 6], logprobs["content"],
                                                                                   [1, 2, 3])


def test_the_terminal_chunk_keeps_finish_stop_and_weight_versions_and_the_usage_chunk_its_usage():
    chunks = DerenderChunks("cid", "policy", 7)
    end = chunks.chat_chunk(_chunk([9], finish="tool_calls", stop_reason=None))
    read = read_chunk(end)
    assert read.finish_reason == "tool_calls" and read.weight_versions == [{"version": "v1", "start": 0, "end": 2}]
    usage = {"prompt_tokens": 3, "total_tokens": 5, "completion_tokens": 2}
    out = chunks.chat_chunk({"request_id": "x", "usage": usage, "output_mode": "derender", "choices": []})
    assert out["choices"] == [] and read_chunk(out).usage == usage


def test_an_error_event_passes_unchanged_for_the_relay_to_record():
    error = {"error": {"message": "boom", "type": "InternalServerError", "code": 500}}
    assert DerenderChunks("c", "m", 0).chat_chunk(error) is error


@pytest.mark.parametrize("chunk,says", [
    (_chunk(None), "token_ids is None, not a list"),
    (_chunk([5, 6], logprobs={"content": [_entry(5)]}), "2 token id(s) and 1 logprobs.content"),
    (_chunk([5], logprobs=None), "1 token id(s) and no logprobs.content"),
    ({"choices": "x"}, "'choices' must be a list"),
])
def test_missing_ids_or_unpaired_log_probs_are_refused_never_guessed(chunk, says):
    with pytest.raises(DerenderError, match=re.escape(says)):
        DerenderChunks("c", "m", 0).chat_chunk(chunk)


def test_a_step_without_ids_or_log_probs_is_a_valid_chunk():
    # vLLM sends an abort's terminal step with no new ids; its log-probs then say nothing either.
    out = DerenderChunks("c", "m", 0).chat_chunk(_chunk([], finish="abort", logprobs=None))
    assert read_chunk(out).finish_reason == "abort"


def _calls(fn: Any, *args: Any) -> int:
    count = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    sys.setprofile(profile)
    try:
        fn(*args)
    finally:
        sys.setprofile(None)
    return count


def test_one_chunk_costs_the_same_python_calls_whatever_its_token_count():
    chunks = DerenderChunks("c", "m", 0)
    one = _calls(chunks.chat_chunk, _chunk([5]))
    many = _calls(chunks.chat_chunk, _chunk(list(range(64))))
    assert one == many <= 20, (one, many)


def test_nulls_of_a_derendered_delta_are_dropped_as_the_chat_route_never_sends_them():
    # A later tool-call delta dumped whole: the OpenAI SDK's stream merge fails on "type": null.
    delta = {"role": None, "content": None, "reasoning": None, "tool_calls": [
        {"id": None, "type": None, "index": 0, "function": {"name": None, "arguments": "{\"a\""}}]}
    out = DerenderChunks("c", "m", 0).chat_chunk(_chunk([5], delta=delta))
    assert out["choices"][0]["delta"] == {"tool_calls": [{"index": 0, "function": {"arguments": "{\"a\""}}]}
    first = {"role": "assistant", "content": None, "reasoning": "hm", "tool_calls": [
        {"id": "call_1", "type": "function", "index": 0, "function": {"name": "Bash", "arguments": None}}]}
    out = DerenderChunks("c", "m", 0).chat_chunk(_chunk([5], delta=first))
    assert out["choices"][0]["delta"] == {"role": "assistant", "reasoning": "hm", "tool_calls": [
        {"index": 0, "id": "call_1", "type": "function", "function": {"name": "Bash"}}]}
