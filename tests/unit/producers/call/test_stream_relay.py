"""The relay of a streamed call reads the engine's SSE lines as the spec splits them."""

from __future__ import annotations

import json

import httpx
import orjson
import pytest

from schemas.records import CallCaptured
from tests.unit.producers.test_cost_counters import CHAT, MESSAGES


def _chunk(k: int, text: str, *, last: bool = False, first: bool = False) -> bytes:
    chunk = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 0, "model": "policy",
             "choices": [{"index": 0, "delta": {"content": text}, "token_ids": [100 + k],
                          "logprobs": {"content": [{"token": text, "logprob": -0.5, "bytes": list(text.encode()),
                                                    "top_logprobs": []}]},
                          "finish_reason": "stop" if last else None}]}
    if first:
        chunk["prompt_token_ids"] = [1, 2, 3]
        chunk["choices"][0]["delta"]["role"] = "assistant"
    # pydantic's model_dump_json, as vLLM streams: U+2028 and U+0085 stay raw inside JSON strings
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\u0085"])
async def test_a_token_holding_a_unicode_line_separator_is_captured_whole(interceptor, upstream, publisher, separator):
    texts = ["Hello", f" a{separator}b", " end"]
    sse = b"".join(_chunk(k, t, first=k == 0, last=k == len(texts) - 1) for k, t in enumerate(texts))
    upstream.responses.append(httpx.Response(200, content=sse + b"data: [DONE]\n\n",
                                             headers={"content-type": "text/event-stream"}))
    r = await interceptor.post(CHAT.format(rid="sep"), json={"model": "policy", "messages": MESSAGES, "stream": True})
    assert r.status_code == 200
    events = [json.loads(line[6:]) for line in r.text.split("\n\n") if line.startswith("data: {")]
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events) == "".join(texts)
    (captured,) = [e.body for e in publisher.events]
    assert isinstance(captured, CallCaptured), captured
    assert captured.generation_token_ids == [100, 101, 102]
    assert json.loads(captured.output_items_json)[0]["content"][0]["text"] == "".join(texts)
