"""Does the engine stream derendered generations from supplied prompt ids? Asked once, at startup.

vLLM 0.34's ``/inference/v1/generate`` takes the render's ``GenerateRequest`` with ids in and, with
``stream`` and ``output_mode: "derender"``, streams parsed chat deltas with each step's token ids
(``producers.engine.derender``); vLLM 0.32 has no derender mode and 0.33 refuses it streamed. The
interceptor asks once when prefix supply is on (``producers.services.probe_prefix_supply_of``) and
notes the answer on the engine catalog (``EngineCatalog.streams_derender``); no call ever probes.

Guarantees: ``probe_generate_stream`` says "" only when one real token-in generation
(``max_tokens`` 1) came back as a derendered stream that reports the supplied ids as its prompt and
carries generated ids and their log-probs in the shape ``DerenderChunks`` takes; any other answer
(an error, a refusal, another shape) is the reason why not, never an exception. ``post_stream``
raises ``EngineCallError`` naming the route and the status for every failure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx
import orjson

from producers.engine.derender import GENERATE_PATH, DerenderChunks, generate_request
from producers.engine.info import RENDER_PATH, EngineCallError, engine_message, post_json

__all__ = ["post_stream", "probe_generate_stream"]

_PROBE = [{"role": "user", "content": "tokentrail prefix-supply probe: the token-in route"}]


async def probe_generate_stream(client: httpx.AsyncClient, headers: Mapping[str, str | bytes],
                                model: str | None) -> str:
    """Why the engine cannot stream a derendered generation from supplied ids ("" when it can)."""
    body: dict[str, Any] = {"messages": _PROBE, "max_tokens": 1, "stream": True, "logprobs": True, "top_logprobs": 0,
                            "return_token_ids": True, "include_reasoning": True}
    if model:
        body["model"] = model
    try:
        rendered = await post_json(client, RENDER_PATH, headers, body)
        ids = rendered.get("token_ids") if isinstance(rendered, dict) else None
        if not isinstance(ids, list):
            raise ValueError(f"its render answered no token_ids list ({str(rendered)[:200]})")
        request = generate_request(rendered, ids, include_usage=False)  # ValueError unless 0.34's shape
        chunks = await post_stream(client, GENERATE_PATH, headers, request)
        translate = DerenderChunks("probe", "probe", 0).chat_chunk
        read = [translate(c) for c in chunks if isinstance(c, dict)]  # DerenderError (a ValueError): bad ids
    except (EngineCallError, ValueError) as exc:
        return f"it does not stream derendered generations from supplied ids ({exc})"
    choices = [choice for chunk in read for choice in chunk.get("choices") or ()]
    if not read or read[0].get("prompt_token_ids") != ids or not any(c.get("token_ids") for c in choices):
        return (f"its {GENERATE_PATH} stream did not report the supplied ids as its prompt with generated ids "
                f"(first event: {str(chunks[:1])[:200]})")
    return ""


async def post_stream(client: httpx.AsyncClient, path: str, headers: Mapping[str, str | bytes],
                      body: dict[str, Any], limit: int = 1 << 20) -> list[Any]:
    """The JSON data events of a short SSE answer (at most ``limit`` bytes: a probe's); EngineCallError otherwise."""
    try:
        # httpx takes str and bytes header values mixed; its type hint says one or the other.
        sent: Any = {**headers, "content-type": "application/json"}
        request = client.build_request("POST", path, headers=sent, content=orjson.dumps(body))
        response = await client.send(request, stream=True)
    except Exception as exc:  # in-process upstreams raise anything, not only httpx errors
        raise EngineCallError(f"POST {path}: engine unreachable ({exc!r})") from exc
    try:
        kind = response.headers.get("content-type", "")
        if response.status_code >= 400 or not kind.startswith("text/event-stream"):
            # Read only a JSON body (an error): a body of another kind may never end.
            data = await response.aread() if kind.startswith("application/json") else b""
            raise EngineCallError(f"POST {path}: HTTP {response.status_code} ({kind or 'no content-type'}): "
                                  f"{engine_message(data) if data else 'not an event stream'}", response.status_code)
        data = b""
        async for part in response.aiter_bytes():
            data += part
            if len(data) > limit:
                raise EngineCallError(f"POST {path}: the stream ran past {limit} bytes")
    except EngineCallError:
        raise
    except Exception as exc:
        raise EngineCallError(f"POST {path}: reading the stream failed ({exc!r})") from exc
    finally:
        await response.aclose()
    try:
        return [orjson.loads(line[5:]) for line in data.splitlines()
                if line.startswith(b"data:") and line[5:].strip() != b"[DONE]"]
    except ValueError as exc:
        raise EngineCallError(f"POST {path}: an event is not JSON ({exc})") from exc
