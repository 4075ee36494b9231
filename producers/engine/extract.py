"""Read the engine's exact tokens out of a vLLM chat-completions response, and strip them (pure).

vLLM 0.33 with ``return_token_ids`` puts the prompt ids at the top level
(``prompt_token_ids``), the generated ids on the choice (``token_ids``) and one
log-prob per generated token in ``logprobs.content[]``. All three must be there:
none at all means the engine returned no token ids (the call is lost for
training); some but not all is partial metadata. Both are reported, never
patched up.

A log-prob that is not a finite number above vLLM's floor of -9999.0 is partial
metadata too: vLLM writes -9999.0 both for a sampled token missing from its
logprob dict and for a clamped -inf, so the value is not the policy's.

No Python-level work runs per token: the arrays are read and checked by C loops
(``array``, ``map``, ``sum``, ``min``); only a refusal looks for the culprit
(``tests/unit/producers/test_cost_counters.py`` counts it).
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from producers.dialects.common import json_type
from schemas.errors import ContractError

# vLLM-only fields the interceptor asks for upstream (return_token_ids, return_weight_versions,
# kv_transfer_params) and must never hand to the harness, whether or not the harness asked for
# them: token ids, routing, and the weight version (another rollout's policy state) are ours.
# Streaming and not, every dialect strips these (the chat dialect directly, the others build
# their own answers).
TOP_LEVEL_TOKEN_FIELDS = ("prompt_token_ids", "prompt_logprobs", "kv_transfer_params")
CHOICE_TOKEN_FIELDS = ("token_ids", "routed_experts", "weight_versions")
VLLM_LOGPROB_FLOOR = -9999.0  # serving.py: the default logprob of an entry, and the clamp of -inf


class PartialTokenMetadata(ContractError):
    """The engine returned some token metadata but not all of it."""


@dataclass(frozen=True, slots=True)
class EngineTokens:
    prompt_token_ids: list[int]
    generation_token_ids: list[int]
    generation_log_probs: list[float]
    routed_experts: Any = None


def extract_chat_tokens(response: dict[str, Any]) -> EngineTokens | None:
    """The call's tokens, None when the engine sent none, PartialTokenMetadata when incomplete."""
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices:
        raise PartialTokenMetadata("response has no choices: cannot attribute tokens")
    if len(choices) != 1:
        raise PartialTokenMetadata(f"response has {len(choices)} choices; capture needs n=1")
    choice = choices[0]
    prompt = response.get("prompt_token_ids")
    generation = choice.get("token_ids")
    content = (choice.get("logprobs") or {}).get("content")
    present = {"prompt_token_ids": prompt is not None, "choices[0].token_ids": generation is not None,
               "choices[0].logprobs.content": content is not None}
    if not any(present.values()):
        return None
    if not all(present.values()):
        missing = sorted(k for k, v in present.items() if not v)
        raise PartialTokenMetadata(f"engine response lacks {', '.join(missing)} (has the others)")
    for name, value in (("choices[0].token_ids", generation), ("choices[0].logprobs.content", content)):
        if not isinstance(value, list):  # a number has no length: named here, not a crash below
            raise PartialTokenMetadata(f"{name} must be a list, got a JSON {json_type(value)}")
    assert content is not None and generation is not None  # present, all of them
    if len(content) != len(generation):
        raise PartialTokenMetadata(
            f"engine returned {len(content)} log-probs for {len(generation)} generated tokens"
        )
    try:
        log_probs = array("d", map(_LOGPROB, content))
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise PartialTokenMetadata(f"malformed logprobs.content entry: {exc!r}") from exc
    _check_log_probs(log_probs, generation)
    return EngineTokens(
        prompt_token_ids=_ids(prompt, "prompt_token_ids"),
        generation_token_ids=_ids(generation, "choices[0].token_ids"),
        generation_log_probs=log_probs.tolist(),
        routed_experts=choice.get("routed_experts"),
    )


_LOGPROB = itemgetter("logprob")


def _check_log_probs(log_probs: array[float], generation: Any) -> None:
    # C loops: the sum of log-probs is finite only if each is (NaN and infinities carry through), and
    # then their minimum is a number. Only a refusal walks the values to name the culprit.
    if not log_probs or (math.isfinite(sum(log_probs)) and min(log_probs) > VLLM_LOGPROB_FLOOR):
        return
    for i, value in enumerate(log_probs):  # `not (floor < v)` is also true for NaN
        if not (VLLM_LOGPROB_FLOOR < value) or math.isinf(value):
            token = generation[i] if isinstance(generation, list) and i < len(generation) else "?"
            why = ("vLLM's placeholder for a sampled token missing from its logprob dict, or a clamped -inf"
                   if value == VLLM_LOGPROB_FLOOR else "not a finite log-probability")
            raise PartialTokenMetadata(f"logprob {value!r} of generated token {i} (id {token}) is {why}: the "
                                       "policy's log-prob of that token is unknown")


def _ids(value: Any, name: str) -> list[int]:
    # array() checks every element at C speed: non-integers raise TypeError, ids
    # outside [0, 2**32) raise OverflowError (the wire carries ids as uint32).
    try:
        if not isinstance(value, list):
            raise TypeError(type(value).__name__)
        array("I", value)
    except (TypeError, OverflowError) as exc:
        raise PartialTokenMetadata(f"{name} must be a list of token ids in [0, 2**32): {exc}") from exc
    return value


def strip_chat_response(response: dict[str, Any], *, keep_logprobs: bool) -> dict[str, Any]:
    """A copy of the response without any token field the interceptor asked for."""
    out = {k: v for k, v in response.items() if k not in TOP_LEVEL_TOKEN_FIELDS}
    choices = []
    for choice in response.get("choices") or []:
        clean = {k: v for k, v in choice.items() if k not in CHOICE_TOKEN_FIELDS}
        if not keep_logprobs:
            clean["logprobs"] = None
        choices.append(clean)
    out["choices"] = choices
    return out


def chat_output_items(message: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """Responses-shaped output items of a chat message (no token fields), and the carrier index.

    Items: an optional reasoning item, the assistant message (always, so every
    call has a carrier), then one ``function_call`` item per tool call. These
    hash like the chat message a harness echoes back (schemas.hashing).
    """
    items: list[dict[str, Any]] = []
    reasoning = message.get("reasoning") or message.get("reasoning_content")
    if reasoning:
        items.append({"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": reasoning}]})
    content = message.get("content")
    parts = [{"type": "output_text", "text": content, "annotations": []}] if content else []
    items.append({"type": "message", "role": "assistant", "status": "completed", "content": parts})
    carrier = len(items) - 1
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        items.append(
            {
                "type": "function_call",
                "call_id": call.get("id", ""),
                "name": function.get("name", ""),
                "arguments": function.get("arguments", ""),
                "status": "completed",
            }
        )
    return items, carrier
