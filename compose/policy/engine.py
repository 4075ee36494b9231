"""The policy engine: a chat request body in, a validated job and its generation out.

It owns the tokenizer, the model table, the scripted agent and the current weight
version, and applies vLLM 0.33's request rules (the ones a harness or the interceptor
can trip over): ``n`` must be 1, ``top_logprobs`` needs ``logprobs`` and is capped by
``max_logprobs``, ``stream_options`` needs ``stream``, the prompt plus ``max_tokens``
must fit ``max_model_len`` (``max_tokens`` defaults to what is left).

Guarantees: ``prepare`` either returns a job whose ``prompt_ids`` are exactly the ids the
generation conditions on, or raises ``RequestError`` carrying a vLLM-style status, type
and message; nothing is generated for an invalid request. Generation is deterministic
per (prompt ids, request seed or prompt hash, sampling parameters, weight version).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compose.policy import template
from compose.policy.agent import AgentPolicy, Generation, GenerationParams
from compose.policy.model import PolicyModel
from compose.policy.settings import FAULTS, PolicySettings
from compose.policy.tokenizer import get_tokenizer

_FAULT_MARKER = re.compile(r"\[\[fault:([a-z0-9_]+)\]\]")


class RequestError(Exception):
    def __init__(self, message: str, status: int = 400, err_type: str = "BadRequestError",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.err_type, self.param = message, status, err_type, param


@dataclass
class ChatJob:
    body: dict
    messages: list[Any]
    tools: list[Any] | None
    tool_choice: Any
    prompt_ids: list[int]
    prompt_text: str
    params: GenerationParams
    seed: int
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    tokens_as_ids: bool = False
    return_token_ids: bool = False
    return_prompt_text: bool = False
    return_weight_versions: bool = False
    include_reasoning: bool = True
    faults: frozenset[str] = field(default_factory=frozenset)

    @property
    def tools_enabled(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"


def _get(body: dict, name: str, kinds: tuple[type, ...], default: Any = None) -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise RequestError(f"'{name}' has the wrong type", param=name)
    return value


def fault_markers(messages: list[Any]) -> set[str]:
    """Fault names marked ``[[fault:NAME]]`` in the last message's content."""
    if not messages or not isinstance(messages[-1], dict):
        return set()
    try:
        text = template.content_text(messages[-1].get("content"))
    except template.TemplateError:
        return set()
    return {m for m in _FAULT_MARKER.findall(text) if m in FAULTS}


class PolicyEngine:
    def __init__(self, settings: PolicySettings) -> None:
        self.settings = settings
        self.tok = get_tokenizer(settings.vocab_words)
        self.model = PolicyModel(self.tok.vocab_size, seed=settings.seed,
                                 rows=settings.table_rows, scale=settings.logit_scale)
        self.agent = AgentPolicy(self.model, self.tok, settings.default_tool_calls)
        self.weight_version = settings.weight_version

    def check_model(self, body: dict) -> None:
        model = body.get("model")
        if self.settings.strict_model and model is not None and model != self.settings.served_model_name:
            raise RequestError(f"The model `{model}` does not exist.", 404, "NotFoundError", "model")

    def prepare(self, body: Any) -> ChatJob:
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        self.check_model(body)
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise RequestError("'messages' must be a list", param="messages")
        n = _get(body, "n", (int,), 1)
        if n != 1:
            raise RequestError("n must be 1: the reference policy server samples one choice", param="n")
        tools = _get(body, "tools", (list,))
        for tool in tools or ():
            function = tool.get("function") if isinstance(tool, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise RequestError("each tool needs function.name", param="tools")
        tool_choice = body.get("tool_choice", "auto" if tools else "none")
        if tool_choice is None:
            tool_choice = "auto" if tools else "none"
        if tool_choice not in ("none", "auto", "required") and not isinstance(tool_choice, dict):
            raise RequestError("'tool_choice' must be none, auto, required or a named tool", param="tool_choice")
        if tool_choice != "none" and tool_choice != "auto" and not tools:
            raise RequestError("When using `tool_choice`, `tools` must be set.", param="tool_choice")
        if isinstance(tool_choice, dict):
            named = (tool_choice.get("function") or {}).get("name")
            offered = [(t.get("function") or {}).get("name") for t in tools if isinstance(t, dict)]
            if named not in offered:
                raise RequestError(f"Tool '{named}' has not been passed in `tools`.", param="tool_choice")
        logprobs = bool(_get(body, "logprobs", (bool,), False))
        top_logprobs = _get(body, "top_logprobs", (int,), 0)
        if top_logprobs and not logprobs:
            raise RequestError("when using `top_logprobs`, `logprobs` must be set to true.", param="top_logprobs")
        if top_logprobs < 0 or top_logprobs > self.settings.max_logprobs:
            raise RequestError(f"Requested sample logprobs of {top_logprobs}, which is greater than "
                               f"max allowed: {self.settings.max_logprobs}", param="top_logprobs")
        stream = bool(_get(body, "stream", (bool,), False))
        stream_options = _get(body, "stream_options", (dict,))
        if stream_options is not None and not stream:
            raise RequestError("Stream options can only be defined when `stream=True`.", param="stream_options")
        faults = frozenset(self.settings.faults | fault_markers(messages))
        kwargs = _get(body, "chat_template_kwargs", (dict,), {})
        reasoning = bool(kwargs.get("enable_thinking", self.settings.reasoning))
        try:
            prompt_ids, prompt_text = self._prompt(body, messages, tools)
        except template.TemplateError as exc:
            raise RequestError(str(exc), param="messages") from None
        params = self._params(body, len(prompt_ids), reasoning, "drift" in faults)
        seed = _get(body, "seed", (int,))
        if seed is None:
            digest = hashlib.blake2b(np.asarray(prompt_ids, dtype=np.int64).tobytes(), digest_size=8)
            seed = int.from_bytes(digest.digest(), "little")
        return ChatJob(
            body=body, messages=messages, tools=tools, tool_choice=tool_choice,
            prompt_ids=prompt_ids, prompt_text=prompt_text, params=params, seed=seed,
            stream=stream,
            include_usage=bool((stream_options or {}).get("include_usage")),
            continuous_usage=bool((stream_options or {}).get("continuous_usage_stats")),
            logprobs=logprobs, top_logprobs=top_logprobs,
            tokens_as_ids=bool(_get(body, "return_tokens_as_token_ids", (bool,), False)),
            return_token_ids=bool(_get(body, "return_token_ids", (bool,), False)),
            return_prompt_text=bool(_get(body, "return_prompt_text", (bool,), False)),
            return_weight_versions=bool(_get(body, "return_weight_versions", (bool,), False)),
            include_reasoning=bool(_get(body, "include_reasoning", (bool,), True)),
            faults=faults,
        )

    def _prompt(self, body: dict, messages: list[Any], tools: list[Any] | None) -> tuple[list[int], str]:
        drop = self.settings.drop_reasoning_in_history
        add_gen = bool(_get(body, "add_generation_prompt", (bool,), True))
        prefix = body.get("required_prefix_token_ids")
        if self.settings.honour_prefix and prefix is not None:
            if not isinstance(prefix, list) or not all(self.tok.is_valid(t) for t in prefix):
                raise RequestError("'required_prefix_token_ids' must be a list of token ids",
                                   param="required_prefix_token_ids")
            last = template.last_assistant_index(messages)
            if last is None:
                raise RequestError("'required_prefix_token_ids' needs an assistant message: the "
                                   "prefix replaces everything up to the last assistant turn",
                                   param="required_prefix_token_ids")
            suffix = template.render_continuation(messages[last + 1:], add_generation_prompt=add_gen,
                                                  drop_reasoning=drop)
            ids = list(prefix) + self.tok.encode(suffix)
            return ids, self.tok.decode(ids)
        text = template.render_prompt(messages, tools, add_generation_prompt=add_gen, drop_reasoning=drop)
        return self.tok.encode(text), text

    def _params(self, body: dict, prompt_len: int, reasoning: bool, drift: bool) -> GenerationParams:
        limit = self.settings.max_model_len
        if prompt_len >= limit:
            raise RequestError(f"This model's maximum context length is {limit} tokens. However, your "
                               f"request has {prompt_len} input tokens. Please reduce the length of "
                               "the input messages.", param="messages")
        max_tokens = _get(body, "max_completion_tokens", (int,))
        if max_tokens is None:
            max_tokens = _get(body, "max_tokens", (int,))
        if max_tokens is None:
            max_tokens = limit - prompt_len
        elif max_tokens < 1:
            raise RequestError("max_tokens must be at least 1", param="max_tokens")
        elif prompt_len + max_tokens > limit:
            raise RequestError(f"This model's maximum context length is {limit} tokens. However, you "
                               f"requested {prompt_len + max_tokens} tokens ({prompt_len} in the messages, "
                               f"{max_tokens} in the completion).", param="max_tokens")
        temperature = float(_get(body, "temperature", (int, float), 1.0))
        top_p = float(_get(body, "top_p", (int, float), 1.0))
        top_k = _get(body, "top_k", (int,), 0)
        if temperature < 0:
            raise RequestError("temperature must be non-negative", param="temperature")
        if not 0 < top_p <= 1:
            raise RequestError("top_p must be in (0, 1]", param="top_p")
        stop = _get(body, "stop", (str, list), [])
        stop = [stop] if isinstance(stop, str) else stop
        stop_ids = _get(body, "stop_token_ids", (list,), [])
        if not all(isinstance(s, str) for s in stop) or not all(self.tok.is_valid(t) for t in stop_ids):
            raise RequestError("'stop' must be strings and 'stop_token_ids' token ids", param="stop")
        return GenerationParams(
            max_tokens=max_tokens, temperature=temperature, top_p=top_p,
            top_k=max(top_k, 0), ignore_eos=bool(_get(body, "ignore_eos", (bool,), False)),
            stop=tuple(s for s in stop if s), stop_token_ids=tuple(stop_ids),
            reasoning=reasoning, drift=drift, weight_version=self.weight_version,
        )

    def generate(self, job: ChatJob) -> Generation:
        rng = np.random.default_rng([self.settings.seed, job.seed % 2**64])
        return self.agent.generate(job.prompt_ids, job.messages, job.tools, job.tool_choice,
                                   job.params, rng)

    def score(self, ids: list[int], start: int, version: int | None = None) -> list[float]:
        return self.model.score(ids, start, self.weight_version if version is None else version)
