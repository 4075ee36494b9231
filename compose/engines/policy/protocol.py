"""vLLM 0.34 (and 0.33) wire shapes for ``/v1/chat/completions``: the full response, and the pieces of a stream.

``settings.vllm_release`` picks the release; they differ only where 0.34 leaves a key out
instead of sending ``null`` (``Field(exclude_if=...)``): ``message.annotations`` and
``usage.prompt_tokens_details`` (``compose/engines/vllm_contract/vllm-0.34.0.json``). The
checked-in description of 0.34 pins these shapes (``tests/unit/compose/engines/test_vllm_contract.py``).

* Non-streaming responses are vLLM's ``model_dump()``: every field present, unset ones
  ``null`` but for the two above in 0.34 (top level: ``prompt_logprobs``, ``prompt_token_ids``, ``prompt_text``,
  ``kv_transfer_params``, ``ec_transfer_params``, ``metrics``; per choice: ``stop_reason``,
  ``token_ids``, ``routed_experts``, ``weight_versions``); ``message.tool_calls`` is
  omitted when empty; ``usage.completion_tokens_details`` is ``{"reasoning_tokens": N}``
  when the server runs a reasoning parser (``settings.reasoning``), else ``null``.
* Chunks are ``model_dump_json(exclude_unset=True)`` (``stream.py`` sequences them): the
  first chunk of each choice has ``delta: {role, content: ""}`` and top-level
  ``prompt_token_ids``; token chunks have ``delta``, ``logprobs``, ``finish_reason: null``,
  ``token_ids`` and top-level ``kv_transfer_params: null``; a choice's terminal chunk adds
  ``stop_reason`` and ``weight_versions`` (``null`` unless requested), and
  ``system_fingerprint`` when no usage chunk follows; the usage chunk has ``choices: []``
  and no nulls.
* With ``include_reasoning: false`` token ids and log-probs are suppressed (vLLM's
  ``suppress_metadata``: this server always runs with a tool/reasoning parser).
* ``weight_versions`` is vLLM's span list ``[{"version", "start", "end"}]`` over the
  generated tokens: one span per run of tokens generated under one label
  (``weight_version_spans``); ``[]`` for a choice that generated nothing (an abort).
* Tool calls: Hermes markup parsed as vLLM does (``parsing.py``), a forced tool choice's
  JSON as vLLM does (``forced.py``; the message content is then ``""``);
  ``parallel_tool_calls: false`` keeps only the first call in the message and the
  deltas, never in ``token_ids``. Finish reason ``"tool_calls"`` only when calls were
  parsed, the engine stopped by itself (``"stop"``) and the tool was not forced by name.

Log-prob values are the raw table values, clamped at -9999.0 like vLLM (never reached).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np
import orjson

from compose.engines.policy import tokenizer as tk
from compose.engines.policy.agent import Generation
from compose.engines.policy.engine import ChatJob, PolicyEngine
from compose.engines.policy.parsing import ParsedOutput, parse_output
from compose.engines.policy.settings import PolicySettings

VLLM_VERSIONS = {"0.33": "0.33.0", "0.34": "0.34.0"}
VLLM_VERSION = VLLM_VERSIONS["0.34"]  # the default release


def dumps(obj: Any) -> str:
    """Compact JSON like pydantic's ``model_dump_json`` (floats round-trip exactly)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def completion_json(obj: dict[str, Any]) -> bytes:
    """A whole answer's JSON, as ``dumps`` writes it but for float notation (``1e-5``, not ``1e-05``:
    the same number), in C: the stdlib encoder took a fifth of the server's CPU on 8k-token prompts.
    Its only floats are log-probs; one that is not finite is refused, as ``dumps`` refuses it (orjson
    writes it as ``null``, which no log-prob of an answer is)."""
    data = orjson.dumps(obj)
    if b'"logprob":null' in data:
        raise ValueError("Out of range float values are not JSON compliant: a non-finite log-prob")
    return data


def error_body(message: str, err_type: str = "BadRequestError", code: int = 400,
               param: str | None = None) -> dict:
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


def system_fingerprint(settings: PolicySettings) -> str:
    """vLLM's default ``--fingerprint-mode full``: ``vllm-<version>-<hash8>`` of the serving config."""
    config = f"{settings.served_model_name}|{settings.seed}|{settings.table_rows}|{settings.logit_scale}|" \
             f"{settings.vocab_words}|{settings.max_model_len}"
    return f"vllm-{VLLM_VERSIONS[settings.vllm_release]}-{hashlib.sha256(config.encode()).hexdigest()[:8]}"


def reasoning_tokens(ids: list[int]) -> int:
    """vLLM's ``count_reasoning_tokens``: ids inside ``<think>`` spans."""
    count = depth = 0
    for token in ids:
        if token == tk.THINK:
            depth += 1
        elif token == tk.THINK_END:
            depth = max(depth - 1, 0)
        elif depth:
            count += 1
    return count


def weight_version_spans(labels: list[str]) -> list[dict]:
    """vLLM's spans of per-token labels (``vllm/v1/engine/output_processor.py``
    ``track_weight_version`` / ``_weight_version_spans``): a span starts at the index of the
    first token whose label differs from the previous token's and ends where the next one
    starts (the last at the token count); a label that comes back starts a new span; no
    tokens, no spans."""
    spans: list[dict] = []
    for i, label in enumerate(labels):
        if not spans or spans[-1]["version"] != label:
            if spans:
                spans[-1]["end"] = i
            spans.append({"version": label, "start": i, "end": len(labels)})
    return spans


class ResponseShaper:
    """Builds the JSON of one chat completion (all its choices) from a job and its generations."""

    def __init__(self, engine: PolicyEngine, job: ChatJob, gens: list[Generation], request_id: str,
                 created: int, model_name: str) -> None:
        self.engine, self.job, self.gens = engine, job, list(gens)
        self.id, self.created, self.model_name = request_id, created, model_name
        self.tok = engine.tok
        self.fingerprint = system_fingerprint(engine.settings)
        self.reasoning_parser = engine.settings.reasoning
        self.nulls_kept = engine.settings.vllm_release == "0.33"  # 0.34 omits annotations, prompt_tokens_details
        # vLLM: include_reasoning=false with a parser hides ids and log-probs
        self.suppress = not job.include_reasoning
        self.send_ids = job.return_token_ids and "no_token_ids" not in job.faults
        self.send_logprobs = job.logprobs and not self.suppress

    @property
    def gen(self) -> Generation:
        return self.gens[0]

    # -- pieces ---------------------------------------------------------------------

    def logprob_entries(self, gen: Generation, start: int, end: int) -> list[dict]:
        entries = []
        for i in range(start, end):
            token = gen.token_ids[i]
            entry = self._entry(token, self._value(gen, i, token, gen.logprobs[i]))
            top: list[dict] = []
            if self.job.top_logprobs != 0:
                # vLLM's logprob dict holds the sampled token first, then the top-k by rank;
                # the listing is its first N entries.
                ids, values = self.engine.model.top_logprobs(gen.rows[i], gen.versions[i])
                pairs = [(token, gen.logprobs[i])]
                pairs += [(int(t), float(v)) for t, v in zip(ids, values) if int(t) != token]
                top = [self._entry(t, self._value(gen, i, t, v)) for t, v in pairs[: self.job.top_logprobs]]
            entry["top_logprobs"] = top
            entries.append(entry)
        return entries

    def _value(self, gen: Generation, i: int, token: int, raw: float) -> float:
        """The ``logprob`` vLLM reports under the server's ``--logprobs-mode`` (raw log-probs by default)."""
        mode = self.engine.settings.logprobs_mode
        if mode == "raw_logprobs":
            return raw
        p = self.job.params
        return self.engine.model.reported(mode, gen.rows[i], gen.versions[i], token, p.temperature, p.top_p,
                                          p.top_k)

    def _entry(self, token: int, logprob: float) -> dict:
        text = f"token_id:{token}" if self.job.tokens_as_ids else self.tok.token_str(token)
        return {"token": text, "logprob": max(logprob, -9999.0), "bytes": list(text.encode("utf-8"))}

    def weight_versions(self, gen: Generation) -> list[dict] | None:
        if not self.job.return_weight_versions:
            return None
        return weight_version_spans(gen.labels)

    def usage(self, completion_tokens: int, reasoning: int | None = None, *, details: bool = True) -> dict:
        prompt = len(self.job.prompt_ids)
        out: dict[str, Any] = {"prompt_tokens": prompt, "total_tokens": prompt + completion_tokens,
                               "completion_tokens": completion_tokens}
        if details:
            out["completion_tokens_details"] = (
                {"reasoning_tokens": reasoning or 0} if self.reasoning_parser else None)
        return out

    def parsed(self, gen: Generation) -> ParsedOutput:
        job = self.job
        parsed = parse_output(self.tok, gen.token_ids, tools_enabled=job.tools_enabled,
                              tool_choice=job.tool_choice, forced=job.forced and job.params.forced_json)
        if isinstance(gen.stop_reason, str) and parsed.content:
            cut = parsed.content.find(gen.stop_reason)
            if cut >= 0:  # vLLM drops the stop string and what follows it
                parsed.content = parsed.content[:cut]
        if not job.include_reasoning:
            parsed.reasoning = None
        if job.forced:
            parsed.content = parsed.content or ""  # vLLM's message for a forced tool choice
        return parsed

    def finish_reason(self, gen: Generation, tools_called: bool) -> str:
        reason = gen.finish_reason or "stop"
        if tools_called and not self.job.named and reason == "stop":
            return "tool_calls"
        return reason

    def prompt_logprobs(self) -> list | None:
        """vLLM's shape: ``None`` for the first prompt token, then ``{id: {logprob, rank, decoded_token}}``."""
        k = self.job.prompt_logprobs
        ids = self.job.prompt_ids
        if k is None:
            return None
        version = self.gen.weight_version
        table = self.engine.model.table(version)
        rows = self.engine.model.rows_for(ids, 1, version)
        out: list = [None]
        for j, row in zip(range(1, len(ids)), rows.tolist()):
            token = ids[j]
            values = table[row]
            lp = float(values[token])
            entry = {str(token): self._prompt_entry(token, lp, int(np.sum(values > lp)) + 1)}
            if k:
                top, top_values = self.engine.model.top_logprobs(row, version)
                for rank, (t, v) in enumerate(zip(top.tolist()[:k], top_values.tolist()[:k]), start=1):
                    entry.setdefault(str(t), self._prompt_entry(t, float(v), rank))
            out.append(entry)
        return out

    def _prompt_entry(self, token: int, logprob: float, rank: int) -> dict:
        return {"logprob": max(logprob, -9999.0), "rank": rank, "decoded_token": self.tok.token_str(token)}

    # -- full response --------------------------------------------------------------

    def choice(self, index: int, gen: Generation) -> dict:
        parsed = self.parsed(gen)
        message: dict[str, Any] = {"role": "assistant", "content": parsed.content, "refusal": None}
        if self.nulls_kept:
            message["annotations"] = None
        message.update(audio=None, function_call=None)
        calls = parsed.tool_calls if self.job.parallel_tool_calls else parsed.tool_calls[:1]
        if calls:
            message["tool_calls"] = [
                {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
                for cid, name, args in calls
            ]
        message["reasoning"] = parsed.reasoning
        return {
            "index": index,
            "message": message,
            "logprobs": ({"content": self.logprob_entries(gen, 0, len(gen.token_ids))}
                         if self.send_logprobs else None),
            "finish_reason": self.finish_reason(gen, bool(parsed.tool_calls)),
            "stop_reason": gen.stop_reason,
            "token_ids": list(gen.token_ids) if self.send_ids and not self.suppress else None,
            "routed_experts": None,
            "weight_versions": self.weight_versions(gen),
        }

    def completion(self) -> dict:
        job = self.job
        choices = [self.choice(i, gen) for i, gen in enumerate(self.gens)]
        usage = self.usage(sum(len(g.token_ids) for g in self.gens),
                           sum(reasoning_tokens(g.token_ids) for g in self.gens))
        details = usage["completion_tokens_details"]
        usage = {"prompt_tokens": usage["prompt_tokens"], "total_tokens": usage["total_tokens"],
                 "completion_tokens": usage["completion_tokens"]}
        if self.nulls_kept:
            usage["prompt_tokens_details"] = None
        usage["completion_tokens_details"] = details
        return {
            "id": self.id, "object": "chat.completion", "created": self.created,
            "model": self.model_name, "choices": choices, "service_tier": None,
            "system_fingerprint": self.fingerprint, "usage": usage, "prompt_logprobs": self.prompt_logprobs(),
            "prompt_token_ids": list(job.prompt_ids) if self.send_ids else None,
            "prompt_text": job.prompt_text if job.return_prompt_text else None,
            "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None,
        }

    # -- chunks ---------------------------------------------------------------------

    def chunk(self, choices: list[dict], **extra: Any) -> str:
        body = {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                "model": self.model_name, "choices": choices}
        body.update(extra)
        return f"data: {dumps(body)}\n\n"

    def first_chunk(self, index: int) -> str:
        extra: dict[str, Any] = {}
        if self.job.continuous_usage:
            extra["usage"] = self.usage(0, 0)
        extra["prompt_token_ids"] = list(self.job.prompt_ids) if self.send_ids else None
        extra["prompt_text"] = self.job.prompt_text if self.job.return_prompt_text else None
        choice = {"index": index, "delta": {"role": "assistant", "content": ""},
                  "logprobs": None, "finish_reason": None}
        return self.chunk([choice], **extra)

    def token_chunk(self, index: int, gen: Generation, start: int, end: int, delta: dict,
                    finish_reason: str | None) -> str:
        choice: dict[str, Any] = {
            "index": index, "delta": delta,
            "logprobs": {"content": self.logprob_entries(gen, start, end)} if self.send_logprobs else None,
            "finish_reason": finish_reason,
        }
        if finish_reason is not None:
            choice["stop_reason"] = gen.stop_reason
        ids_out = self.send_ids and not self.suppress
        choice["token_ids"] = list(gen.token_ids[start:end]) if ids_out else None
        if finish_reason is not None:
            choice["weight_versions"] = self.weight_versions(gen)
        extra: dict[str, Any] = {}
        if self.job.continuous_usage:
            extra["usage"] = self.usage(end, reasoning_tokens(gen.token_ids[:end]))
        if finish_reason is not None and not self.job.include_usage:
            extra["system_fingerprint"] = self.fingerprint
        extra["kv_transfer_params"] = None
        return self.chunk([choice], **extra)

    def usage_chunk(self) -> str:
        usage = self.usage(sum(len(g.token_ids) for g in self.gens),
                           sum(reasoning_tokens(g.token_ids) for g in self.gens))
        if usage["completion_tokens_details"] is None:
            del usage["completion_tokens_details"]
        return self.chunk([], usage=usage, system_fingerprint=self.fingerprint)
