"""``POST /inference/v1/generate``: tokens in, a derendered chat stream out, as vLLM 0.34 streams it.

vLLM 0.34's token-in route (``vllm/entrypoints/scale_out/token_in_token_out/serving.py``) takes the
``GenerateRequest`` that ``/v1/chat/completions/render`` answered (``render.py``), generates from its
``token_ids`` and, with ``output_mode: "derender"`` and ``stream: true``, sends one
``GenerateDerenderStreamResponse`` per step: ``model_dump_json`` with ``prompt_token_ids``,
``mm_placeholders`` and ``metrics`` left out when None, so every other field is present (``usage``,
``output_mode``, and per choice ``finish_reason``, ``stop_reason``, ``token_ids``, ``routed_experts``,
``sampling_mask``, ``weight_versions``, the parsed ``delta`` with ``role``, ``content``,
``reasoning`` and, when any, ``tool_calls``, and ``logprobs`` in the chat shape). The first chunk of
a choice carries ``delta.role: "assistant"`` with its first token (no separate role chunk); the first
chunk of the stream carries ``prompt_token_ids`` when ``return_token_ids``; ``weight_versions`` comes
on a choice's terminal chunk only (vLLM attaches spans to finished outputs); the usage chunk
(``stream_options.include_usage``) is ``model_dump_json(exclude_none=True)`` with ``choices: []``.
Every chunk of a choice carries its ``token_ids`` (vLLM hides them only with ``include_reasoning:
false``), so the ids of a stream concatenate to the generation, as on the chat route.

Releases: 0.34 serves it; 0.33 (and this server's 0.33 mode, which also answers as the 0.32 CPU build)
refuses ``stream`` with ``output_mode: "derender"`` (0.33's docs: "``stream: true`` isn't supported
yet"; 0.32 has no derender mode at all). The refusal text here is this server's own, naming the field.

What the stand-in does not model (each refused with a 400 naming the field): ``output_mode`` other
than ``"derender"``, and a non-streamed derender answer. Its scripted agent plans from the
conversation (``script.py``: directives, tool results), which a token-in request does not carry, so
the conversation comes from the render that made the request: the render's ``request_id`` names it
(``RenderMemory``, bounded). The generation conditions on the request's ``token_ids`` exactly, as the
chat route does with ``kv_transfer_params.prompt_token_ids``: the same ids give the same tokens and
log-probs on both routes.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

from compose.engines.policy.protocol import ResponseShaper, dumps, weight_version_spans
from compose.engines.policy.validation import RequestError

GENERATE_PATH = "/inference/v1/generate"
OUTPUT_MODES = ("tokens", "text", "derender")  # vLLM 0.34's OutputMode (0.32 has no "derender")


class RenderMemory:
    """The chat bodies of recent renders, by the ``request_id`` their answer carried (bounded, oldest out)."""

    def __init__(self, size: int = 1024) -> None:
        self.size = size
        self._bodies: OrderedDict[str, dict] = OrderedDict()

    def remember(self, request_id: str, body: dict) -> None:
        self._bodies[request_id] = body
        while len(self._bodies) > self.size:
            self._bodies.popitem(last=False)

    def take(self, request_id: Any) -> dict | None:
        return self._bodies.pop(request_id, None) if isinstance(request_id, str) else None


def chat_body(request: Any, release: str, memory: RenderMemory) -> dict:
    """The chat body whose job generates what ``request`` (a GenerateRequest) asks; RequestError otherwise."""
    if not isinstance(request, dict):
        raise RequestError("the request body must be a GenerateRequest object", param="body")
    mode = request.get("output_mode", "tokens")
    if mode not in OUTPUT_MODES:
        raise RequestError(f"output_mode={mode!r}: use one of {', '.join(OUTPUT_MODES)}", param="output_mode")
    stream = request.get("stream") or False
    if mode == "derender" and stream and release == "0.33":
        raise RequestError("output_mode='derender' does not support stream=true in vLLM 0.33 (streamed derender "
                           "is new in vLLM 0.34): send stream=false, or supply prompt ids on /v1/chat/completions "
                           "as kv_transfer_params.prompt_token_ids", param="stream")
    if mode != "derender" or not stream:
        raise RequestError(f"the reference server models only stream=true with output_mode='derender' on "
                           f"{GENERATE_PATH} (got stream={stream!r}, output_mode={mode!r}); send those",
                           param="output_mode")
    ids = request.get("token_ids")
    if not isinstance(ids, list) or not ids:
        raise RequestError(f"token_ids must be a non-empty list of token ids, got {str(ids)[:60]}", param="token_ids")
    sampling = request.get("sampling_params")
    if not isinstance(sampling, dict):
        raise RequestError("sampling_params is required: send the one /v1/chat/completions/render answered",
                           param="sampling_params")
    body = memory.take(request.get("request_id"))
    if body is None:
        raise RequestError(f"request_id {request.get('request_id')!r} names no render of this server: the reference "
                           "server's scripted agent plans from the conversation, so send the GenerateRequest that "
                           "its /v1/chat/completions/render answered", param="request_id")
    chat = dict(body)
    chat["kv_transfer_params"] = {**(chat.get("kv_transfer_params") or {}), "prompt_token_ids": ids}
    chat["stream"] = True
    chat["stream_options"] = request.get("stream_options")
    chat["return_token_ids"] = bool(request.get("return_token_ids"))
    logprobs = sampling.get("logprobs")
    chat["logprobs"] = logprobs is not None
    chat["top_logprobs"] = logprobs or 0
    if isinstance(sampling.get("max_tokens"), int):
        chat.pop("max_completion_tokens", None)
        chat["max_tokens"] = sampling["max_tokens"]
    return chat


def response_id(header: str | None, request: dict) -> str:
    """vLLM's ``generate-tokens-`` + the ``X-Request-Id`` header, else the request's ``request_id``."""
    return f"generate-tokens-{header if header is not None else request.get('request_id')}"


class DerenderShaper(ResponseShaper):
    """``ResponseShaper`` whose stream pieces are ``GenerateDerenderStreamResponse`` chunks (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        job = self.job
        self.ids_out = "no_token_ids" not in job.faults and not self.suppress
        self.send_ids = True  # every step of a choice is sent: its token ids are (stream.py's rule)
        self.prompt_pending = job.return_token_ids
        self.role_sent = [False] * len(self.gens)
        self.created = int(time.time())

    def first_chunk(self, index: int) -> str:
        return ""  # the role rides on the choice's first token chunk

    def _delta(self, index: int, delta: dict) -> dict:
        role = None
        if not self.role_sent[index]:
            role, self.role_sent[index] = "assistant", True
        out: dict[str, Any] = {"role": role, "content": delta.get("content"), "reasoning": delta.get("reasoning")}
        calls = delta.get("tool_calls")
        if calls:  # DeltaMessage's serializer drops an empty list
            out["tool_calls"] = [{"id": c.get("id"), "type": c.get("type"), "index": c["index"],
                                  "function": None if c.get("function") is None else {
                                      "name": c["function"].get("name"), "arguments": c["function"].get("arguments")}}
                                 for c in calls]
        return out

    def token_chunk(self, index: int, gen: Any, start: int, end: int, delta: dict,
                    finish_reason: str | None) -> str:
        finished = finish_reason is not None
        choice = {
            "index": index, "finish_reason": finish_reason, "stop_reason": gen.stop_reason if finished else None,
            "token_ids": list(gen.token_ids[start:end]) if self.ids_out else None,
            "routed_experts": None, "sampling_mask": None,
            "weight_versions": weight_version_spans(gen.labels) if finished else None,
            "delta": self._delta(index, delta),
            "logprobs": {"content": self.logprob_entries(gen, start, end)} if self.send_logprobs else None,
        }
        body: dict[str, Any] = {"request_id": self.id, "usage": None}
        if self.job.continuous_usage:
            body["usage"] = {**self.usage(end, details=False), "completion_tokens_details": None}
        if self.prompt_pending:
            body["prompt_token_ids"] = list(self.job.prompt_ids)
            self.prompt_pending = False
        body["output_mode"] = "derender"
        body["choices"] = [choice]
        return f"data: {dumps(body)}\n\n"

    def usage_chunk(self) -> str:
        usage = self.usage(sum(len(g.token_ids) for g in self.gens), details=False)
        return f"data: {dumps({'request_id': self.id, 'usage': usage, 'output_mode': 'derender', 'choices': []})}\n\n"
