"""vLLM 0.34's token-in stream for prefix supply: its request, and its chunks as chat chunks (pure, stdlib only).

With prefix supply the interceptor sends a continuing call's exact prompt ids (``prefix_supply``).
vLLM 0.32 takes them on the chat route as ``kv_transfer_params.prompt_token_ids`` (a field made for
prefill/decode disaggregation, which a KV connector also reads). vLLM 0.34 has a route made for ids
in: ``POST /v1/chat/completions/render`` answers the request as the engine would run it (a
``GenerateRequest``: ``token_ids``, ``sampling_params``, ``parse_context``, ...), and ``POST
/inference/v1/generate`` with that request, its ``token_ids`` replaced by the supplied ids,
``output_mode: "derender"`` and ``stream: true`` streams one ``GenerateDerenderStreamResponse`` per
step: the chat ``delta`` its parsers made (content, reasoning, tool-call deltas) with that step's
``token_ids`` and ``logprobs`` (the chat route's ``ChatCompletionLogProbs``).

``route_for`` picks the route of a call, ``generate_request`` builds the request, and
``DerenderChunks.chat_chunk`` turns each chunk into the chat-completions chunk the stream path
already reads (``producers.dialects.chat_chunks.read_chunk``), so every dialect works on top unchanged.

Guarantees of ``chat_chunk``:

* The token fields (``prompt_token_ids``, ``token_ids``, ``logprobs``, ``weight_versions``) are handed
  on as the engine sent them, the same objects: ids and log-probs are bit-exact what it sent.
* Fail closed: a choice whose ``token_ids`` is not a list, or whose ``logprobs.content`` does not hold
  exactly one entry per id, raises ``DerenderError`` naming the chunk's field and counts; the caller
  records the call as incomplete (masked), never guesses which id a text or log-prob belongs to.
* A chunk without ``choices`` (vLLM's error event) is returned unchanged, for the caller to record.
* One flat function per chunk: a fixed number of lookups, no loop over tokens, no copy of the arrays
  (a tool-call step also rebuilds its few tool-call deltas without their nulls: ``_chat_delta``).
  Fields the chat shape has no place for are left out: ``sampling_mask``, ``routed_experts`` (the chat
  stream's are not captured either), ``metrics``, ``mm_placeholders``, ``output_mode``, ``request_id``.
"""

from __future__ import annotations

from typing import Any

from schemas.errors import ContractError
from schemas.records import PrefixRoute

__all__ = ["GENERATE_PATH", "DerenderChunks", "DerenderError", "generate_request", "route_for"]

GENERATE_PATH = "/inference/v1/generate"
_FIX = ("serve with vLLM >= 0.34, whose render route answers a GenerateRequest with parse_context, or the "
        "interceptor falls back to kv_transfer_params on /v1/chat/completions")


class DerenderError(ContractError, ValueError):
    """A generate chunk whose token fields cannot be taken as they are (the call is masked, not guessed)."""


def route_for(supplied: bool, streamed: bool, engine_streams_derender: bool) -> PrefixRoute:
    """The route of a call: ``GENERATE`` for supplied ids of a streamed call on an engine that streams
    derendered generations (learned once at startup), ``CHAT`` for other supplied ids, ``NONE`` without.

    A non-streamed call stays on the chat route: its answer is one chat completion either way, and the
    chat route's abort-and-continue path and answer reader serve it already.
    """
    if not supplied:
        return PrefixRoute.NONE
    return PrefixRoute.GENERATE if streamed and engine_streams_derender else PrefixRoute.CHAT


def generate_request(rendered: Any, prompt_ids: list[int], *, include_usage: bool) -> dict[str, Any]:
    """The ``/inference/v1/generate`` body: the render's ``GenerateRequest`` with ``prompt_ids`` in, streamed,
    derendered, the prompt ids reported back; ValueError naming the field when ``rendered`` is not 0.34's."""
    if not isinstance(rendered, dict):
        raise ValueError(f"the render answer must be a GenerateRequest object, got {str(rendered)[:120]!r}; {_FIX}")
    for key in ("token_ids", "sampling_params", "parse_context"):
        value = rendered.get(key)
        if not isinstance(value, list if key == "token_ids" else dict):
            raise ValueError(f"the render answer's {key!r} is {str(value)[:80]!r}, not vLLM 0.34's; {_FIX}")
    out = dict(rendered)
    out["token_ids"] = prompt_ids
    out["output_mode"] = "derender"
    out["stream"] = True
    out["return_token_ids"] = True  # the first chunk then reports the prompt ids: the proof they were used
    out["stream_options"] = {"include_usage": include_usage, "continuous_usage_stats": False}
    out["kv_transfer_params"] = None
    return out


class DerenderChunks:
    """Turns one call's ``GenerateDerenderStreamResponse`` chunks into chat-completions chunks (module doc)."""

    __slots__ = ("_head", "_logprobs")

    def __init__(self, chunk_id: str, model: str, created: int, *, logprobs: bool = True) -> None:
        self._head = (chunk_id, model, created)
        self._logprobs = logprobs  # asked for: every id needs its entry

    def chat_chunk(self, chunk: dict[str, Any]) -> dict[str, Any]:
        choices = chunk.get("choices")
        if choices is None:
            return chunk  # an error event: the relay records it
        chunk_id, model, created = self._head
        out: dict[str, Any] = {"id": chunk_id, "object": "chat.completion.chunk", "created": created, "model": model,
                               "choices": choices}
        ids = chunk.get("prompt_token_ids")
        if ids is not None:
            out["prompt_token_ids"] = ids
        usage = chunk.get("usage")
        if usage is not None:
            out["usage"] = usage
        if not choices:
            return out
        if type(choices) is not list or type(source := choices[0]) is not dict:
            raise DerenderError(f"'choices' must be a list of objects, got {str(choices)[:80]!r}")
        ids = source.get("token_ids")
        if type(ids) is not list:
            raise DerenderError(f"choices[0].token_ids is {str(ids)[:40]}, not a list: the step's ids are missing "
                                "(does the engine hide them, include_reasoning false?)")
        logprobs = source.get("logprobs")
        if self._logprobs and ids:
            entries = logprobs.get("content") if type(logprobs) is dict else None
            if type(entries) is not list or len(entries) != len(ids):
                got = len(entries) if type(entries) is list else "no"
                raise DerenderError(f"choices[0] carries {len(ids)} token id(s) and {got} logprobs.content "
                                    "entries: which log-prob belongs to which id is ambiguous")
        choice = {"index": source.get("index", 0), "delta": _chat_delta(source.get("delta")), "logprobs": logprobs,
                  "finish_reason": source.get("finish_reason"), "stop_reason": source.get("stop_reason"),
                  "token_ids": ids}
        versions = source.get("weight_versions")
        if versions is not None:
            choice["weight_versions"] = versions
        choices[0] = choice  # in place: the chunk is this call's own (a second choice stays, for read_chunk to refuse)
        return out


def _chat_delta(delta: Any) -> Any:
    """The delta as the chat route sends it: only the keys that say something.

    0.34 dumps a derendered delta whole (``role``, ``content``, ``reasoning`` null when unset, and
    each tool-call delta's ``id``, ``type``, ``function.name``/``arguments``), where the chat route
    sends only what is set (``exclude_unset``). Clients merge deltas by key: the OpenAI SDK takes
    a later ``"type": null`` for a changed tool-call type and fails, so nulls are dropped here.
    """
    if type(delta) is not dict:
        return delta or {}  # read_chunk refuses a delta of another type, naming it
    out = {}
    for key in ("role", "content", "reasoning"):
        value = delta.get(key)
        if value is not None:
            out[key] = value
    calls = delta.get("tool_calls")
    if calls:
        out["tool_calls"] = [_tool_delta(call) for call in calls] if type(calls) is list else calls
    return out


def _tool_delta(call: Any) -> Any:
    if type(call) is not dict:
        return call  # read_chunk refuses it, naming it
    out = {key: call[key] for key in ("index", "id", "type") if call.get(key) is not None}
    function = call.get("function")
    if type(function) is dict:
        out["function"] = {key: function[key] for key in ("name", "arguments") if function.get(key) is not None}
    elif function is not None:
        out["function"] = function
    return out
