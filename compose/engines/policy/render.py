"""``POST /v1/chat/completions/render``: the request as vLLM would hand it to the engine (tokens in).

The answer is vLLM's ``GenerateRequest.model_dump()`` (``vllm/entrypoints/scale_out/render/``,
``vllm/entrypoints/scale_out/token_in_token_out/protocol.py``): ``request_id``
(``chatcmpl-`` + the ``X-Request-Id`` header, else the body's ``request_id``, else a random
id), ``token_ids`` (the rendered prompt, or ``kv_transfer_params.prompt_token_ids`` when
given), ``sampling_params`` (``sampling.render_dump``), ``model``, ``reasoning_ended`` and
``reasoning_parser_kwargs`` (set when the server runs a reasoning parser), ``stream``,
``stream_options``, ``cache_salt``, ``priority``, in 0.34 ``parse_context`` (what a
derendering ``/inference/v1/generate`` needs to parse the output: tools, tool choice,
``include_reasoning``, template kwargs, the count of tool calls in the history), and the
remaining fields null or at their defaults. The same validation as ``/v1/chat/completions`` applies up to the
sampling parameters (model name, budget, prompt length); nothing is generated.

Not modelled: ``structured_outputs`` (vLLM adds the tool-call grammar to a forced tool
choice's sampling parameters), ``token_offsets`` (this tokenizer has none) and media.
"""

from __future__ import annotations

import uuid
from typing import Any

from compose.engines.policy import tokenizer as tk
from compose.engines.policy.engine import ChatJob, PolicyEngine
from compose.engines.policy.sampling import render_dump


def reasoning_ended(job: ChatJob, reasoning_parser: bool) -> bool | None:
    """``ChatCompletionRequest.resolve_reasoning_ended`` with the qwen3-style parser's prompt scan."""
    if not job.include_reasoning:
        return True
    if not reasoning_parser:
        return None
    for token in reversed(job.prompt_ids):
        if token == tk.THINK:
            return False
        if token == tk.THINK_END:
            return True
    return False


def template_kwargs(body: dict) -> dict[str, Any]:
    """The effective chat template kwargs (``build_chat_params``: the request's, then vLLM's own, minus unset)."""
    kwargs = dict(body.get("chat_template_kwargs") or {})
    extra = {"add_generation_prompt": body.get("add_generation_prompt", True),
             "continue_final_message": body.get("continue_final_message", False),
             "documents": body.get("documents"), "reasoning_effort": body.get("reasoning_effort")}
    if body.get("reasoning_effort") is not None and "enable_thinking" not in kwargs:
        extra["enable_thinking"] = body["reasoning_effort"] != "none"
    return kwargs | {k: v for k, v in extra.items() if v is not None and v != "auto"}


def _tool_dump(tool: dict) -> dict[str, Any]:
    """A ``ChatCompletionToolsParam.model_dump()``: unset ``strict`` left out, unset description null."""
    function = tool.get("function") or {}
    dumped = {"name": function.get("name"), "description": function.get("description"),
              "parameters": function.get("parameters")}
    if function.get("strict") is not None:
        dumped["strict"] = function["strict"]
    return {"type": "function", "function": dumped}


def parse_context(job: ChatJob) -> dict[str, Any]:
    """vLLM 0.34's ``_build_parse_context`` (``vllm/entrypoints/scale_out/render/serving.py``)."""
    body = job.body
    tools = None if job.tools is None else [_tool_dump(t) for t in job.tools]
    out: dict[str, Any] = {"tools": tools, "tool_choice": job.tool_choice,
                           "parallel_tool_calls": job.parallel_tool_calls, "include_reasoning": job.include_reasoning}
    if body.get("return_tokens_as_token_ids") is not None:  # Field(exclude_if=None)
        out["return_tokens_as_token_ids"] = job.tokens_as_ids
    history = sum(len(m.get("tool_calls") or ()) for m in job.messages
                  if isinstance(m, dict) and m.get("role") == "assistant")
    return out | {"chat_template_kwargs": template_kwargs(body), "history_tool_call_cnt": history}


def generate_request(engine: PolicyEngine, job: ChatJob, header_request_id: str | None) -> dict[str, Any]:
    body = job.body
    reasoning_parser = engine.settings.reasoning
    kv = dict(body.get("kv_transfer_params") or {})
    kv.pop("prompt_token_ids", None)
    options = body.get("stream_options") if job.stream else None
    base_id = header_request_id if header_request_id is not None else body.get("request_id") or uuid.uuid4().hex
    out = {
        "request_id": f"chatcmpl-{base_id}",
        "token_ids": list(job.prompt_ids),
        "token_offsets": None,
        "features": None,
        "content_parts": None,
        "sampling_params": render_dump(
            job.sampling, stream=job.stream, logprobs=job.top_logprobs if job.logprobs else None,
            prompt_logprobs=job.prompt_logprobs,
            # vLLM's hermes parser keeps special tokens whenever tools may be called
            skip_special_tokens=job.sampling["skip_special_tokens"] and not job.tools_enabled,
            extra_args={"kv_transfer_params": kv} if kv else None),
        "model": body.get("model"),
        "reasoning_ended": reasoning_ended(job, reasoning_parser),
        "reasoning_parser_kwargs": {"chat_template_kwargs": template_kwargs(body)} if reasoning_parser else None,
        "return_token_ids": None,
        "output_mode": "tokens",
        "stream": job.stream,
        "stream_options": None if options is None else {
            "include_usage": bool(options.get("include_usage", False)),
            "continuous_usage_stats": bool(options.get("continuous_usage_stats", False))},
        "cache_salt": body.get("cache_salt"),
        "priority": body.get("priority", 0),
        "kv_transfer_params": None,
        "ec_transfer_params": None,
    }
    if engine.settings.vllm_release != "0.33":
        out["parse_context"] = parse_context(job)
    return out
