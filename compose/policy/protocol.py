"""vLLM 0.33 wire shapes for ``/v1/chat/completions``: the full response and SSE chunks.

Shapes follow ``reference/stack.md`` §5 and vLLM's serving code:

* Non-streaming responses are vLLM's ``model_dump()``: unset vendor fields are present
  as ``null`` (``stop_reason``, ``token_ids``, ``routed_experts``, ``weight_versions``,
  ``prompt_logprobs``, ``prompt_token_ids``, ``prompt_text``, ``kv_transfer_params``);
  ``message.tool_calls`` is omitted when empty.
* Chunks are vLLM's ``model_dump_json(exclude_unset=True)``: only the fields vLLM sets.
  The first chunk has ``delta: {role, content: ""}`` and top-level ``prompt_token_ids``;
  token chunks have ``delta``, ``logprobs``, ``finish_reason: null`` and ``token_ids``;
  the terminal chunk adds ``finish_reason`` and ``stop_reason``; the optional usage chunk
  has ``choices: []`` and no nulls.
* With ``include_reasoning: false`` token ids and log-probs are suppressed (vLLM's
  ``suppress_metadata``: this server always runs with a tool/reasoning parser).
* ``weight_versions`` (with ``return_weight_versions``) is vLLM's span list
  ``[{"version": str, "start": 0, "end": n}]`` over the generated ids; the version label
  is the decimal string of the integer weight version.

Log-prob values are the raw table values, clamped at -9999.0 like vLLM (never reached).
"""

from __future__ import annotations

import json
from typing import Any

from compose.policy.agent import Generation
from compose.policy.engine import ChatJob, PolicyEngine
from compose.policy.parsing import ParsedOutput, parse_output


def dumps(obj: Any) -> str:
    """Compact JSON like pydantic's ``model_dump_json`` (floats round-trip exactly)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def error_body(message: str, err_type: str = "BadRequestError", code: int = 400,
               param: str | None = None) -> dict:
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


class ResponseShaper:
    """Builds the JSON of one chat completion from a job and its generation."""

    def __init__(self, engine: PolicyEngine, job: ChatJob, gen: Generation, request_id: str,
                 created: int, model_name: str) -> None:
        self.engine, self.job, self.gen = engine, job, gen
        self.id, self.created, self.model_name = request_id, created, model_name
        self.tok = engine.tok
        # vLLM: include_reasoning=false with a parser hides ids and log-probs
        self.suppress = not job.include_reasoning
        self.send_ids = job.return_token_ids and "no_token_ids" not in job.faults
        self.send_logprobs = job.logprobs and not self.suppress

    # -- pieces ---------------------------------------------------------------------

    def logprob_entries(self, start: int, end: int) -> list[dict]:
        gen, job = self.gen, self.job
        entries = []
        for i in range(start, end):
            token = gen.token_ids[i]
            entry = self._entry(token, gen.logprobs[i])
            top: list[dict] = []
            if job.top_logprobs > 0:
                # vLLM's logprob dict holds the sampled token first, then the top-k by
                # rank; the listing is its first N entries.
                ids, values = self.engine.model.top_logprobs(gen.rows[i], gen.weight_version)
                pairs = [(token, gen.logprobs[i])]
                pairs += [(int(t), float(v)) for t, v in zip(ids, values) if int(t) != token]
                top = [self._entry(t, v) for t, v in pairs[: job.top_logprobs]]
            entry["top_logprobs"] = top
            entries.append(entry)
        return entries

    def _entry(self, token: int, logprob: float) -> dict:
        text = f"token_id:{token}" if self.job.tokens_as_ids else self.tok.token_str(token)
        return {"token": text, "logprob": max(logprob, -9999.0), "bytes": list(text.encode("utf-8"))}

    def weight_versions(self) -> list[dict]:
        return [{"version": str(self.gen.weight_version), "start": 0, "end": len(self.gen.token_ids)}]

    def usage(self, completion_tokens: int) -> dict:
        prompt = len(self.job.prompt_ids)
        return {"prompt_tokens": prompt, "total_tokens": prompt + completion_tokens,
                "completion_tokens": completion_tokens}

    def parsed(self) -> ParsedOutput:
        parsed = parse_output(self.tok, self.gen.token_ids, tools_enabled=self.job.tools_enabled)
        if isinstance(self.gen.stop_reason, str) and parsed.content:
            cut = parsed.content.find(self.gen.stop_reason)
            if cut >= 0:  # vLLM drops the stop string and what follows it
                parsed.content = parsed.content[:cut]
        if not self.job.include_reasoning:
            parsed.reasoning = None
        return parsed

    def finish_reason(self, tools_called: bool) -> str:
        """Non-streaming: auto tool calls always, required ones when stopped by itself."""
        reason = self.gen.finish_reason or "stop"
        named = isinstance(self.job.tool_choice, dict)
        if tools_called and not named and (self.job.tool_choice == "auto" or reason == "stop"):
            return "tool_calls"
        return reason

    def stream_finish_reason(self, tools_streamed: bool) -> str:
        """Streaming: "tool_calls" only when calls were streamed and the engine stopped."""
        reason = self.gen.finish_reason or "stop"
        if tools_streamed and not isinstance(self.job.tool_choice, dict) and reason == "stop":
            return "tool_calls"
        return reason

    # -- full response --------------------------------------------------------------

    def completion(self) -> dict:
        gen, job = self.gen, self.job
        parsed = self.parsed()
        message: dict[str, Any] = {
            "role": "assistant", "content": parsed.content, "refusal": None,
            "annotations": None, "audio": None, "function_call": None,
        }
        if parsed.tool_calls:
            message["tool_calls"] = [
                {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
                for cid, name, args in parsed.tool_calls
            ]
        message["reasoning"] = parsed.reasoning
        choice = {
            "index": 0,
            "message": message,
            "logprobs": ({"content": self.logprob_entries(0, len(gen.token_ids))}
                         if self.send_logprobs else None),
            "finish_reason": self.finish_reason(bool(parsed.tool_calls)),
            "stop_reason": gen.stop_reason,
            "token_ids": list(gen.token_ids) if self.send_ids and not self.suppress else None,
            "routed_experts": None,
            "weight_versions": self.weight_versions() if job.return_weight_versions else None,
        }
        usage = self.usage(len(gen.token_ids))
        usage["prompt_tokens_details"] = None
        return {
            "id": self.id, "object": "chat.completion", "created": self.created,
            "model": self.model_name, "choices": [choice], "service_tier": None,
            "system_fingerprint": None, "usage": usage, "prompt_logprobs": None,
            "prompt_token_ids": list(job.prompt_ids) if self.send_ids else None,
            "prompt_text": job.prompt_text if job.return_prompt_text else None,
            "kv_transfer_params": None,
        }

    # -- chunks ---------------------------------------------------------------------

    def _chunk(self, choices: list[dict], **extra: Any) -> str:
        body = {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                "model": self.model_name, "choices": choices}
        body.update(extra)
        return f"data: {dumps(body)}\n\n"

    def first_chunk(self) -> str:
        extra: dict[str, Any] = {}
        if self.job.continuous_usage:
            extra["usage"] = self.usage(0)
        extra["prompt_token_ids"] = list(self.job.prompt_ids) if self.send_ids else None
        extra["prompt_text"] = self.job.prompt_text if self.job.return_prompt_text else None
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""},
                  "logprobs": None, "finish_reason": None}
        return self._chunk([choice], **extra)

    def token_chunk(self, start: int, end: int, delta: dict, finish_reason: str | None) -> str:
        choice: dict[str, Any] = {
            "index": 0, "delta": delta,
            "logprobs": {"content": self.logprob_entries(start, end)} if self.send_logprobs else None,
            "finish_reason": finish_reason,
        }
        if finish_reason is not None:
            choice["stop_reason"] = self.gen.stop_reason
        ids_out = self.send_ids and not self.suppress
        choice["token_ids"] = list(self.gen.token_ids[start:end]) if ids_out else None
        if finish_reason is not None and self.job.return_weight_versions:
            choice["weight_versions"] = self.weight_versions()
        extra = {"usage": self.usage(end)} if self.job.continuous_usage else {}
        return self._chunk([choice], **extra)

    def usage_chunk(self) -> str:
        return self._chunk([], usage=self.usage(len(self.gen.token_ids)))
