"""The policy engine: a chat request body in, a validated job and its generations out.

It owns the tokenizer, the model table, the scripted agent and the engine control state
(weight version label, pause), and applies vLLM 0.33's request rules in vLLM's order
(``validation.py``, ``sampling.py``): the request model's validators and field types,
then the model name (404 for a name not served, unless ``strict_model`` is off), the
output budget against ``max_model_len``, the prompt (rendered by the template, or taken
from ``kv_transfer_params.prompt_token_ids``), its length, and the sampling parameters.

Prompt ids in (``vllm/renderers/online_renderer.py``): ``kv_transfer_params.prompt_token_ids``
replaces templating and tokenisation; tools, parsers, streaming and ``return_token_ids``
work as usual, ``prompt_text`` is null. The ids are ignored (the messages rendered) when
``echo`` is set or a message has non-text content.

Guarantees: ``prepare`` either returns a job whose ``prompt_ids`` are exactly the ids the
generations condition on, or raises ``RequestError`` carrying vLLM's status, type, param
and text; nothing is generated for an invalid request. Generation is deterministic per
(prompt ids, request seed or prompt hash, sampling parameters, weight versions, choice).

Weight versions per token (``vllm/v1/engine/core.py`` ``_attach_weight_version`` stamps
each step's output with the engine's label): generations are computed ahead, under the
label current at ``prepare``; ``at_token`` is called as each token is delivered, and when
the label has changed since (an update during a ``keep`` pause, or while the request was
queued) the undelivered rest is generated again under the new version. Tokens already
delivered are unchanged (``agent.py``: a run is a function of its version schedule).
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass, replace
from dataclasses import field as dc_field
from typing import Any

import numpy as np

from compose.engines.policy import sampling, template
from compose.engines.policy.agent import AgentPolicy, Generation, GenerationParams
from compose.engines.policy.control import EngineControl, version_key
from compose.engines.policy.model import PolicyModel
from compose.engines.policy.settings import FAULTS, PolicySettings
from compose.engines.policy.tokenizer import get_tokenizer
from compose.engines.policy.validation import (
    RequestError,
    check_chat_request,
    check_messages,
    check_prompt_ids,
    coerce,
    field,
    has_non_text_content,
    validation_error,
    vllm_error,
)

_FAULT_MARKER = re.compile(r"\[\[fault:([a-z0-9_]+)\]\]")
__all__ = ["ChatJob", "PolicyEngine", "RequestError", "fault_markers"]


@dataclass
class ChatJob:
    body: dict
    messages: list[Any]
    tools: list[Any] | None
    tool_choice: Any
    prompt_ids: list[int]
    prompt_text: str | None
    params: GenerationParams
    seed: int
    sampling: dict[str, Any] = dc_field(default_factory=dict)  # vLLM's SamplingParams values
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    prompt_logprobs: int | None = None
    tokens_as_ids: bool = False
    return_token_ids: bool = False
    return_prompt_text: bool = False
    return_weight_versions: bool = False
    include_reasoning: bool = True
    parallel_tool_calls: bool = True
    reused_prompt_ids: bool = False
    engine_error: RequestError | None = None  # refused by the engine itself: after a stream has started
    faults: frozenset[str] = dc_field(default_factory=frozenset)

    @property
    def tools_enabled(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"

    @property
    def forced(self) -> bool:
        return self.tools_enabled and (self.tool_choice == "required" or isinstance(self.tool_choice, dict))

    @property
    def named(self) -> bool:
        return isinstance(self.tool_choice, dict)


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
        self.control = EngineControl(settings.weight_version)

    @property
    def weight_version(self) -> str:
        return self.control.weight_version

    @weight_version.setter
    def weight_version(self, label: str | int) -> None:
        self.control.weight_version = str(label)

    @functools.cached_property
    def max_chars_per_token(self) -> int:
        return max(len(self.tok.token_str(i)) for i in range(self.tok.vocab_size))

    def check_model(self, body: dict) -> None:
        """vLLM's ``check_model``: no name, or the served one (``vllm/entrypoints/openai/models/serving.py``)."""
        model = body.get("model")
        if self.settings.strict_model and model and model != self.settings.served_model_name:
            raise RequestError(f"The model `{model}` does not exist.", 404, "NotFoundError", "model")

    def prepare(self, body: Any) -> ChatJob:
        if not isinstance(body, dict):
            raise validation_error("model_attributes_type", "body",
                                   "Input should be a valid dictionary or object to extract fields from", body)
        body = check_chat_request(body, self.settings.vllm_release)
        if "messages" not in body:
            raise validation_error("missing", "body.messages", "Field required", None)
        messages = check_messages(body["messages"])
        tools = field(body, "tools", list)
        tool_choice = body.get("tool_choice")
        if tool_choice is None:
            tool_choice = "auto" if tools else "none"
        stream = field(body, "stream", bool, False)
        stream_options = field(body, "stream_options", dict)
        logprobs = field(body, "logprobs", bool, False)
        top_logprobs = field(body, "top_logprobs", int, 0)
        prompt_logprobs = field(body, "prompt_logprobs", int)
        kv = field(body, "kv_transfer_params", dict)
        kwargs = field(body, "chat_template_kwargs", dict, {})
        add_gen = field(body, "add_generation_prompt", bool, True)
        p = sampling.read(body)
        self.check_model(body)
        requested = sampling.requested_budget(p, self.settings.max_model_len)
        faults = frozenset(self.settings.faults | fault_markers(messages))
        prompt_ids, prompt_text, reused = self._prompt(body, messages, tools, kv, add_gen)
        max_tokens = sampling.fitted_budget(requested, len(prompt_ids), self.settings.max_model_len)
        sampling.verify(p, max_tokens)
        reasoning = bool(coerce("chat_template_kwargs.enable_thinking",
                                kwargs.get("enable_thinking", self.settings.reasoning), bool))
        params = sampling.generation_params(
            p, self.tok.vocab_size, reasoning=reasoning, drift="drift" in faults,
            repetition="repetition" in faults, forced_json=self.settings.forced_tool_format == "json",
            weight_version=version_key(self.weight_version), weight_label=self.weight_version)
        seed = p["seed"]
        if seed is None:
            digest = hashlib.blake2b(np.asarray(prompt_ids, dtype=np.int64).tobytes(), digest_size=8)
            seed = int.from_bytes(digest.digest(), "little")
        job = ChatJob(
            body=body, messages=messages, tools=tools, tool_choice=tool_choice,
            prompt_ids=prompt_ids, prompt_text=prompt_text, params=params, seed=seed, sampling=p, n=p["n"],
            stream=stream,
            include_usage=bool((stream_options or {}).get("include_usage")),
            continuous_usage=bool((stream_options or {}).get("include_usage")
                                  and (stream_options or {}).get("continuous_usage_stats")),
            logprobs=logprobs, top_logprobs=top_logprobs, prompt_logprobs=prompt_logprobs,
            tokens_as_ids=field(body, "return_tokens_as_token_ids", bool, False),
            return_token_ids=field(body, "return_token_ids", bool, False),
            return_prompt_text=field(body, "return_prompt_text", bool, False),
            return_weight_versions=field(body, "return_weight_versions", bool, False),
            include_reasoning=field(body, "include_reasoning", bool, True),
            parallel_tool_calls=field(body, "parallel_tool_calls", bool, True),
            reused_prompt_ids=reused, faults=faults,
        )
        job.engine_error = self._engine_checks(job)
        return job

    def _prompt(self, body: dict, messages: list[Any], tools: list[Any] | None, kv: dict | None,
                add_gen: bool) -> tuple[list[int], str | None, bool]:
        ids = kv.get("prompt_token_ids") if kv is not None else None
        if ids is not None and not body.get("echo") and not has_non_text_content(messages):
            return check_prompt_ids(ids, self.tok.vocab_size), None, True
        limit = self.settings.max_model_len
        try:
            text = template.render_prompt(messages, tools, add_generation_prompt=add_gen,
                                          drop_reasoning=self.settings.drop_reasoning_in_history)
        except template.TemplateError as exc:
            raise RequestError(str(exc)) from None
        bound = limit * self.max_chars_per_token
        if len(text) > bound:
            raise vllm_error(f"This model's maximum context length is {limit} tokens. However, your prompt "
                             f"contains {len(text)} characters (more than {bound} characters, which is the upper "
                             f"bound for {limit} input tokens). Please reduce the length of the input prompt.",
                             "input_text", len(text))
        prompt_ids = self.tok.encode(text)
        count = min(len(prompt_ids), limit + 1)  # vLLM tokenises with truncation to max_model_len + 1
        if count > limit:
            qualifier = "at least " if count == limit + 1 else ""
            raise vllm_error(f"This model's maximum context length is {limit} tokens. However, your prompt "
                             f"contains {qualifier}{count} input tokens, which exceeds this limit even without "
                             "any output tokens. Please reduce the length of the input prompt.",
                             "input_tokens", count)
        return prompt_ids, text, False

    def _engine_checks(self, job: ChatJob) -> RequestError | None:
        """What vLLM's input processor refuses (``SamplingParams._validate_logprobs``)."""
        top = self.settings.max_logprobs
        vocab = self.tok.vocab_size
        wanted = (job.top_logprobs if job.top_logprobs != -1 else vocab) if job.logprobs else 0
        if wanted > top:
            return vllm_error(f"Requested sample logprobs of {wanted}, which is greater than max allowed: {top}",
                              "logprobs", wanted)
        prompt_wanted = job.prompt_logprobs if job.prompt_logprobs != -1 else vocab
        if prompt_wanted and prompt_wanted > top:
            return vllm_error(f"Requested prompt logprobs of {prompt_wanted}, which is greater than max allowed: "
                              f"{top}", "prompt_logprobs", prompt_wanted)
        return None

    def generate(self, job: ChatJob, index: int = 0) -> Generation:
        key = [self.settings.seed, job.seed % 2**64] + ([index] if index else [])
        return self.agent.generate(job.prompt_ids, job.messages, job.tools, job.tool_choice, job.params,
                                   np.random.default_rng(key))

    def generate_all(self, job: ChatJob) -> list[Generation]:
        return [self.generate(job, i) for i in range(job.n)]

    def at_token(self, job: ChatJob, gens: list[Generation], t: int) -> list[Generation]:
        """The generations once token ``t`` is generated, under the label current now.

        The same list when the label is the one token ``t`` was generated under; otherwise
        ``job.params`` gains the change (at index 0 it replaces the first label: nothing was
        generated yet, so the prompt log-probs move too) and every choice still generating
        at ``t`` is generated again: tokens ``0..t-1`` identical, the rest under the new table.
        """
        label = self.weight_version
        params = job.params
        if params.at(t)[1] == label:
            return gens
        key = version_key(label)
        if t == 0:
            job.params = replace(params, weight_version=key, weight_label=label, version_changes=())
        else:
            job.params = replace(params, version_changes=params.version_changes + ((t, key, label),))
        return [self.generate(job, i) if len(gen.token_ids) > t else gen for i, gen in enumerate(gens)]

    def score(self, ids: list[int], start: int, version: str | int | None = None) -> list[float]:
        return self.model.score(ids, start, version_key(self.weight_version if version is None else version))
