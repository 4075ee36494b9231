"""The capture's cost, counted, not timed: what a captured call may do, whatever its size.

Deterministic guards of the hot path (docs/ARCHITECTURE.md §8): per captured call the engine's answer
is parsed once (each chunk of a stream once), each event is encoded once, two records are produced (the
intent and the capture), and no Python-level work runs per token: the number of Python function calls a
non-streaming call makes does not grow with its prompt or its generation (``sys.setprofile`` counts
every call, of Python functions and of builtins called from Python, in the interceptor's thread). A change
that parses twice, encodes twice or adds a per-token loop back fails here.
"""

from __future__ import annotations

import gc
import sys
from collections import Counter
from typing import Any

import httpx
import orjson
import pytest

import producers.dialects.chat_chunks
import producers.engine.chat_stream
import schemas.codec
from tests.unit.producers.conftest import vllm_chat_response

CHAT = "/ng-rollout/{rid}/training-token-capture/v1/chat/completions"
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]


def _answer(prompt: int, generated: int) -> bytes:
    gen = [(7 * k) % 30000 + 10 for k in range(generated)]
    body = vllm_chat_response(list(range(100, 100 + prompt)), gen, text=" ".join(f"w{t}" for t in gen[:8]))
    return orjson.dumps(body)


def _sse(prompt: int, generated: int) -> bytes:
    gen = [(7 * k) % 30000 + 10 for k in range(generated)]
    chunks = []
    for k, token in enumerate(gen):
        chunk: dict[str, Any] = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 0, "model": "policy",
                                 "choices": [{"index": 0, "delta": {"content": f" w{token}"},
                                              "logprobs": {"content": [{"token": f" w{token}", "logprob": -0.5,
                                                                        "bytes": [32, 119], "top_logprobs": []}]},
                                              "finish_reason": "length" if k == generated - 1 else None,
                                              "token_ids": [token]}]}
        if k == 0:
            chunk["prompt_token_ids"] = list(range(100, 100 + prompt))
            chunk["choices"][0]["delta"]["role"] = "assistant"
        chunks.append(b"data: " + orjson.dumps(chunk) + b"\n\n")
    return b"".join(chunks) + b"data: [DONE]\n\n"


class Counted:
    """Counts orjson.loads by what it parsed and codec encodes by record type, for one test."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.parsed: list[bytes] = []
        self.encoded: Counter[str] = Counter()
        loads, encode = orjson.loads, schemas.codec.RecordCodec.encode

        def counting_loads(data: Any) -> Any:
            self.parsed.append(bytes(data) if not isinstance(data, str) else data.encode())
            return loads(data)

        def counting_encode(codec: Any, record: Any) -> bytes:
            body = getattr(record, "body", record)
            self.encoded[type(body).__name__] += 1
            return encode(codec, record)

        monkeypatch.setattr(orjson, "loads", counting_loads)
        monkeypatch.setattr(schemas.codec.RecordCodec, "encode", counting_encode)


@pytest.mark.parametrize("stream", [False, True])
async def test_the_answer_is_parsed_once_each_event_encoded_once_two_records(interceptor, upstream, publisher,
                                                                           monkeypatch, stream):
    answer = _sse(300, 40) if stream else _answer(300, 40)
    headers = {"content-type": "text/event-stream" if stream else "application/json"}
    upstream.responses.append(httpx.Response(200, content=answer, headers=headers))
    counted = Counted(monkeypatch)
    r = await interceptor.post(CHAT.format(rid="cost-1"), json={"model": "policy", "messages": MESSAGES,
                                                                 "stream": stream})
    assert r.status_code == 200
    engine_parts = ([line[len(b"data: "):] for line in answer.split(b"\n\n") if line.startswith(b"data: {")]
                    if stream else [answer])
    for part in engine_parts:
        assert counted.parsed.count(part) == 1, "the engine's answer (or a chunk of it) was parsed twice"
    assert sum(counted.parsed.count(part) for part in engine_parts) == len(engine_parts)
    assert counted.encoded == {"CallStarted": 1, "CallCaptured": 1}
    assert [type(e.body).__name__ for e in publisher.all] == ["CallStarted", "CallCaptured"]


STREAMED = {
    "chat": ("/v1/chat/completions", {"messages": MESSAGES}),
    "anthropic": ("/v1/messages", {"max_tokens": 64, "messages": [{"role": "user", "content": "hello there"}]}),
    "responses": ("/v1/responses", {"input": "hello there"}),
}


@pytest.mark.parametrize("dialect", sorted(STREAMED))
async def test_each_stream_chunk_is_read_once_in_every_dialect(interceptor, upstream, monkeypatch, dialect):
    # The capture reads a chunk (chat_chunks.read_chunk) and hands its reading to the dialect's translator:
    # Claude Code's and Codex's streams cost one read per token, not two.
    upstream.responses.append(httpx.Response(200, content=_sse(300, 40), headers={"content-type": "text/event-stream"}))
    reads: list[Any] = []
    read = producers.dialects.chat_chunks.read_chunk

    def counting_read(chunk: Any) -> Any:
        reads.append(chunk)
        return read(chunk)

    monkeypatch.setattr(producers.dialects.chat_chunks, "read_chunk", counting_read)
    monkeypatch.setattr(producers.engine.chat_stream, "read_chunk", counting_read)
    path, body = STREAMED[dialect]
    r = await interceptor.post(f"/ng-rollout/reads-{dialect}/training-token-capture{path}",
                               json={"model": "policy", "stream": True, **body})
    assert r.status_code == 200 and "w10" in r.text, r.text[:300]
    assert len(reads) == 40, f"{len(reads)} chunk reads for a 40-chunk stream"


async def _counted(request: Any) -> int:
    """The Python function calls (and builtins called from Python) ``request`` makes, in this thread."""
    calls = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1

    gc.disable()  # a collection would run finalizers (Python calls) inside whichever call it lands in
    sys.setprofile(profile)
    try:
        r = await request
    finally:
        sys.setprofile(None)
        gc.enable()
    assert r.status_code == 200
    return calls


async def _python_calls(interceptor: httpx.AsyncClient, upstream: Any, rid: str, prompt: int, generated: int) -> int:
    upstream.responses.append(httpx.Response(200, content=_answer(prompt, generated),
                                             headers={"content-type": "application/json"}))
    return await _counted(interceptor.post(CHAT.format(rid=rid), json={"model": "policy", "messages": MESSAGES}))


async def test_no_python_work_runs_per_token(interceptor, upstream):
    await _python_calls(interceptor, upstream, "warm", 64, 8)  # first-call work (caches, lazy imports)
    # The fewest of three each: an event loop's housekeeping (a timer, a callback) may land in any one call.
    small = min([await _python_calls(interceptor, upstream, f"small{i}", 256, 16) for i in range(3)])
    long_prompt = min([await _python_calls(interceptor, upstream, f"prompt{i}", 8192, 16) for i in range(3)])
    long_generation = min([await _python_calls(interceptor, upstream, f"gen{i}", 256, 512) for i in range(3)])
    # The same messages and answer text: only the token arrays grow (32x and 32x). A handful of calls may
    # differ (a dict resize, a buffer growing); a per-token loop would add hundreds.
    assert abs(long_prompt - small) <= 25, (small, long_prompt)
    assert abs(long_generation - small) <= 25, (small, long_generation)


async def _streamed_python_calls(interceptor: httpx.AsyncClient, upstream: Any, rid: str, dialect: str,
                                 generated: int) -> int:
    upstream.responses.append(httpx.Response(200, content=_sse(64, generated),
                                             headers={"content-type": "text/event-stream"}))
    path, body = STREAMED[dialect]
    return await _counted(interceptor.post(f"/ng-rollout/{rid}/training-token-capture{path}",
                                           json={"model": "policy", "stream": True, **body}))


# Python function calls per streamed chunk (one chunk per token), each dialect: measured 87 (chat), 94
# (anthropic) and 95 (responses), bounded with a ~15% margin. Relaying, reading and translating a chunk
# may cost this; a second read of a chunk (anthropic was 158 with it), a stdlib JSON encoder per event
# or a per-chunk copy of the accumulated tokens adds tens and fails here.
PER_CHUNK_CALLS = {"chat": 100, "anthropic": 108, "responses": 110}


@pytest.mark.parametrize("dialect", sorted(STREAMED))
async def test_a_streamed_chunk_costs_a_bounded_number_of_python_calls(interceptor, upstream, dialect):
    await _streamed_python_calls(interceptor, upstream, f"warm-{dialect}", dialect, 8)
    short = min([await _streamed_python_calls(interceptor, upstream, f"s{i}-{dialect}", dialect, 16)
                 for i in range(3)])
    long = min([await _streamed_python_calls(interceptor, upstream, f"l{i}-{dialect}", dialect, 80)
                for i in range(3)])
    per_chunk = (long - short) / 64
    assert per_chunk <= PER_CHUNK_CALLS[dialect], (dialect, per_chunk)
