"""The stand-in pinned to the real engine: one request set sent to `tokentrail policy` and to real vLLM
(crafted checkpoint, same flags as the rest of the tier), and the answers compared by shape: fields
and their JSON types, stream chunking, finish reasons, and error bodies. Values differ (two different
models); the shape is what the interceptor reads, so the shape is what must not drift."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest

from compose.engines.vllm_rig.engine import SERVED_NAME
from compose.harnesses.sdk import WEATHER_TOOL
from compose.rig.stack import LocalStack
from schemas.wire_kinds import packed_log_probs

pytestmark = [pytest.mark.integration, pytest.mark.real_broker, pytest.mark.vllm]

TOKEN_FIELDS = {"return_token_ids": True, "logprobs": True, "top_logprobs": 0, "include_reasoning": True}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOL_TURN = USER + [
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "Paris: 14 degrees and clear"},
]
REQUESTS = {  # name -> body; each is sent non-streaming and streaming
    "tool_call": {"messages": USER, "tools": [WEATHER_TOOL], **TOKEN_FIELDS},
    "length": {"messages": USER, "max_tokens": 4, **TOKEN_FIELDS},  # past the crafted model's empty reasoning
    "after_tool": {"messages": TOOL_TURN, "tools": [WEATHER_TOOL], **TOKEN_FIELDS},
    "versions": {"messages": USER, "return_weight_versions": True, **TOKEN_FIELDS},
}
ERRORS = {  # name -> (body, expected status)
    "unknown_model": ({"model": "claude-sonnet-4-5", "messages": USER}, 404),
    "max_tokens_over_context": ({"messages": USER, "max_tokens": 10 ** 6}, 400),
    "empty_tools": ({"messages": USER, "tools": []}, 400),
}


@pytest.fixture(scope="module")
def reference(kafka_bootstrap, tmp_path_factory):
    with LocalStack(kafka_bootstrap, tmp_path_factory.mktemp("ref"), topic_prefix=f"ct{uuid.uuid4().hex[:8]}.",
                    with_pipeline=False,
                    # the 0.32 CPU build answers as 0.33 did; 0.34's shapes are pinned by the unit-tier
                    # contract (tests/unit/compose/engines/test_vllm_contract.py)
                    policy_args=("--served-model-name", SERVED_NAME, "--max-model-len", "32768",
                                 "--vllm-release", "0.33")) as stack:
        yield stack.policy_url


@pytest.fixture(scope="module")
def engines(reference, vllm_engine) -> dict[str, str]:
    return {"reference": reference, "vllm": vllm_engine.url}


def shape(value: Any) -> Any:
    """A JSON value's structure: dict keys (recursively), the merged shape of a list's elements,
    scalar type names ("number", "str", "bool", "null"; "str|null" where elements differ)."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        merged = None
        for element in value:
            merged = _merge(merged, shape(element))
        return [] if merged is None else [merged]
    if value is None:
        return "null"
    return "bool" if isinstance(value, bool) else "number" if isinstance(value, (int, float)) else "str"


def _merge(a: Any, b: Any) -> Any:
    if a is None:
        return b
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: _merge(a.get(k), b.get(k)) if k in a and k in b else a.get(k, b.get(k)) for k in sorted({*a, *b})}
    if isinstance(a, list) and isinstance(b, list):
        return [_merge(a[0] if a else None, b[0] if b else None)] if a or b else []
    return a if a == b else "|".join(sorted(set(str(a).split("|")) | set(str(b).split("|"))))


# What the stand-in sends as vLLM 0.33 does and the 0.32 CPU build does not (shared/reference/vllm_0.33.md
# §1: `weight_versions` on chat choices, `kv_transfer_params: null` on every stream chunk), and what
# depends on the server's flags rather than the engine (`completion_tokens_details`: only with a
# reasoning parser; the stand-in reports it with --reasoning, covered in tests/unit/compose/engines/policy).
NOT_COMPARED = {"weight_versions", "kv_transfer_params", "completion_tokens_details"}


def comparable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: comparable(v) for k, v in value.items() if k not in NOT_COMPARED}
    if isinstance(value, list):
        return [comparable(v) for v in value]
    return value


def _post(url: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", json={"model": SERVED_NAME, **body}, timeout=120)


def _chunks(url: str, body: dict) -> list[Any]:
    out: list[Any] = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", timeout=120,
                      json={"model": SERVED_NAME, **body, "stream": True,
                            "stream_options": {"include_usage": True}}) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                out.append("[DONE]" if line == "data: [DONE]" else json.loads(line[6:]))
    return out


def _roles(chunks: list[Any]) -> dict[str, Any]:
    """The stream's parts by role: first chunk, token chunks (merged), terminal chunk, usage chunk."""
    assert chunks[-1] == "[DONE]"
    data = [comparable(c) for c in chunks[:-1]]
    usage = [c for c in data if not c["choices"]]
    body = [c for c in data if c["choices"]]
    terminal = [c for c in body if c["choices"][0].get("finish_reason")]
    assert len(terminal) == 1 and len(usage) == 1
    tokens = [c for c in body[1:] if c is not terminal[0]]
    return {"first": shape(body[0]), "token": shape(tokens), "terminal": shape(terminal[0]), "usage": shape(usage[0]),
            "finish_reason": terminal[0]["choices"][0]["finish_reason"],
            "prompt_ids_only_first": all("prompt_token_ids" not in c for c in body[1:])}


@pytest.mark.parametrize("name", list(REQUESTS))
def test_non_streaming_answers_have_the_same_shape_and_finish_reason(engines, name):
    answers = {kind: _post(url, REQUESTS[name]) for kind, url in engines.items()}
    assert {k: r.status_code for k, r in answers.items()} == {"reference": 200, "vllm": 200}
    ref, real = (comparable(answers[k].json()) for k in ("reference", "vllm"))
    assert shape(ref) == shape(real)
    assert ref["choices"][0]["finish_reason"] == real["choices"][0]["finish_reason"]


@pytest.mark.parametrize("name", list(REQUESTS))
def test_streams_are_chunked_alike(engines, name):
    ref, real = (_roles(_chunks(url, REQUESTS[name])) for url in engines.values())
    assert ref == real


@pytest.mark.parametrize("name", list(REQUESTS))
def test_streamed_ids_concatenate_to_the_non_streaming_ids_on_both(engines, name):
    for url in engines.values():
        whole = _post(url, REQUESTS[name]).json()["choices"][0]["token_ids"]
        streamed = [t for c in _chunks(url, REQUESTS[name])[:-1] for ch in c["choices"] for t in ch.get("token_ids") or []]
        assert streamed == whole


@pytest.mark.parametrize("name", list(ERRORS))
def test_errors_have_the_same_status_and_body(engines, name):
    body, status = ERRORS[name]
    answers = {kind: httpx.post(f"{url}/v1/chat/completions", json={"model": SERVED_NAME, **body}, timeout=60)
               for kind, url in engines.items()}
    assert {k: r.status_code for k, r in answers.items()} == {"reference": status, "vllm": status}
    ref, real = (answers[k].json()["error"] for k in ("reference", "vllm"))
    assert shape(ref) == shape(real) and (ref["type"], ref["code"], ref["param"]) == (real["type"], real["code"],
                                                                                     real["param"])


def test_prompt_ids_supplied_through_kv_transfer_params_replace_rendering_on_both(engines):
    for url in engines.values():
        ids = httpx.post(f"{url}/tokenize", json={"model": SERVED_NAME, "messages": USER,
                                                  "add_generation_prompt": True}, timeout=30).json()["tokens"]
        other = [{"role": "user", "content": "something else entirely"}]
        answer = _post(url, {"messages": other, "max_tokens": 2, "kv_transfer_params": {"prompt_token_ids": ids},
                             **TOKEN_FIELDS}).json()
        assert answer["prompt_token_ids"] == ids


def test_model_cards_and_tokenize_have_the_same_shape(engines):
    cards = {k: httpx.get(f"{u}/v1/models", timeout=30).json() for k, u in engines.items()}
    assert shape(cards["reference"]) == shape(cards["vllm"])
    assert cards["reference"]["data"][0]["max_model_len"] == cards["vllm"]["data"][0]["max_model_len"] == 32768
    toks = {k: httpx.post(f"{u}/tokenize", json={"model": SERVED_NAME, "messages": USER}, timeout=30).json()
            for k, u in engines.items()}
    assert shape(toks["reference"]) == shape(toks["vllm"])


def test_log_probs_are_float32_values_on_both(engines):
    # vLLM computes log-probs in float32, so each reported double is exactly a float32: the wire
    # carries them in 4 bytes (schemas.wire_kinds.packed_log_probs). The stand-in must report the same kind.
    for kind, url in engines.items():
        content = _post(url, REQUESTS["tool_call"]).json()["choices"][0]["logprobs"]["content"]
        values = [entry["logprob"] for entry in content]
        assert values and len(packed_log_probs(values)) == 4 * len(values), kind
