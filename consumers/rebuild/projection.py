"""NeMo RL's Responses projection of a delivered chain (pure).

``{id, object: "response", model, output, usage}``: every call's output items
(token fields stripped), with the token arrays on its *carrier* item:
``prompt_token_ids`` (the whole running sequence: the first prompt, every
earlier generation and every interstitial), ``generation_token_ids``,
``generation_log_probs``, ``routed_experts`` when captured, and
``generation_version_spans`` (``[{version, start, end}]`` over the generation) when versions are known. The carrier is
``output_items[token_item_index]`` when that index is valid, else the first item
that still carries inline ``generation_token_ids`` (legacy records), else the
last item; a call with no items gets a synthesized assistant message.

The projection repeats the running prompt on every carrier, so its size is
calls x tokens. ``project_response_json`` writes the JSON text directly: each
chunk of token ids is formatted once and the running prompt's text is extended
by reference, so the cost is one copy of the output's bytes, not formatting
calls x tokens integers. ``project_response`` is the same projection as a dict, and
``assert_prefix_contiguity`` is NeMo Gym's check over such a dict.
"""

from __future__ import annotations

import json
from typing import Any

from consumers.rebuild.jsontext import dumps as _dumps
from consumers.rebuild.jsontext import id_run as _ids
from consumers.rebuild.links import Node
from consumers.rebuild.trajectory import ChainError, NonFiniteValue
from consumers.rebuild.validity import InvalidJson, NonFiniteJson, strict_loads

TOKEN_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs", "routed_experts",
                "generation_version_spans")
_SYNTHESIZED = {"type": "message", "role": "assistant", "content": []}
# The log-probs' own encoder (ASCII, as they were always written); built once, not per call.
_log_probs_text = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


def project_response_json(chain: list[Node], rollout_id: str) -> str:
    """The projection as compact JSON text (deterministic: same chain, same bytes)."""
    if not chain:
        raise ChainError("no chain to project")
    tail = chain[-1].call
    parts = ['{"id":', _dumps(f"proj-{rollout_id}"), ',"object":"response","model":',
             _dumps(tail.model or tail.facts.served_model), ',"output":[']
    running: list[str] = []  # the running prompt as text pieces: "1,2,3", ",", "10,11", ...
    running_len = 0
    first_item = True
    for node in chain:
        running_len = _extend(running, node.delta, running_len)
        items, carrier = carrier_of(node)
        generation = node.call.generation_token_ids
        generation_text = _ids(generation)
        tail_fields = (
            f'],"generation_token_ids":[{generation_text}],"generation_log_probs":'
            + _log_probs_text(node.call.generation_log_probs)
        )
        if node.call.routed_experts_json is not None:
            try:
                routed = strict_loads(node.call.routed_experts_json)
            except InvalidJson as exc:
                error = NonFiniteValue if isinstance(exc, NonFiniteJson) else ChainError
                raise error(f"call {node.call_id}: routed_experts_json is not valid JSON ({exc}); "
                            "fix the capture of routed experts (strict JSON, finite numbers only)") from None
            tail_fields += ',"routed_experts":' + _dumps(routed)
        if node.call.facts.version_spans:  # per-token versions, over this generation
            tail_fields += ',"generation_version_spans":' + _dumps(
                [{"version": v.version, "start": v.start, "end": v.end} for v in node.call.facts.version_spans])
        for position, item in enumerate(items):
            if not first_item:
                parts.append(",")
            first_item = False
            text = _dumps(strip_token_fields(item))
            if position != carrier:
                parts.append(text)
                continue
            parts.append(text[:-1] + ("," if len(text) > 2 else "") + '"prompt_token_ids":[')
            parts.extend(running)  # references to text formatted once: the copy happens in the final join
            parts.append(tail_fields + "}")
        running_len = _extend(running, generation, running_len, generation_text)
        if running_len != node.call.cum_len:
            raise ChainError(f"call {node.call_id}: projected {running_len} tokens, captured cum_len={node.call.cum_len}")
    usage = {"input_tokens": len(chain[0].delta), "output_tokens": sum(len(n.generation) for n in chain)}
    parts.append('],"usage":' + _dumps(usage) + "}")
    return "".join(parts)


def project_response(chain: list[Node], rollout_id: str) -> dict[str, Any]:
    """The projection as a dict, checked with ``assert_prefix_contiguity``."""
    response: dict[str, Any] = json.loads(project_response_json(chain, rollout_id))
    assert_prefix_contiguity(response["output"])
    return response


def carrier_of(node: Node) -> tuple[list[Any], int]:
    """The call's output items (as captured) and the index of the item that carries its tokens."""
    try:
        items = strict_loads(node.call.output_items_json)
    except InvalidJson as exc:
        error = NonFiniteValue if isinstance(exc, NonFiniteJson) else ChainError
        raise error(f"call {node.call_id}: output_items_json is not valid JSON ({exc}); fix the capture "
                    "of the call's output items (strict JSON, finite numbers only)") from None
    if not isinstance(items, list):
        raise ChainError(f"call {node.call_id}: output items must be a JSON list")
    if not items:
        return [dict(_SYNTHESIZED)], 0
    index = node.call.token_item_index
    if index is not None and not 0 <= index < len(items):  # a direct producer's forged index: never guessed
        raise ChainError(f"call {node.call_id}: token_item_index={index} is outside its {len(items)} output "
                         f"item(s); fix the producer: the index of the output item that carries the tokens, "
                         f"0..{len(items) - 1}, or null")
    if index is None:
        legacy = [i for i, item in enumerate(items) if isinstance(item, dict) and "generation_token_ids" in item]
        index = legacy[0] if legacy else len(items) - 1
    if not isinstance(items[index], dict):
        raise ChainError(f"call {node.call_id}: carrier item {index} is not an object")
    return items, index


def strip_token_fields(item: Any) -> Any:
    if not isinstance(item, dict):
        return item
    return {k: v for k, v in item.items() if k not in TOKEN_FIELDS}


def assert_prefix_contiguity(output: list[dict[str, Any]]) -> None:
    """Each token-bearing item's prompt starts with everything delivered before it (NeMo Gym's check)."""
    seen: list[int] | None = None
    for position, item in enumerate(output):
        if not isinstance(item, dict) or "generation_token_ids" not in item:
            continue
        prompt = item["prompt_token_ids"]
        if seen is not None and prompt[: len(seen)] != seen:
            raise ChainError(f"output item {position}: prompt_token_ids do not extend the previous prompt + generation")
        if len(item.get("generation_log_probs", ())) != len(item["generation_token_ids"]):
            raise ChainError(f"output item {position}: one log-prob per generated token is required")
        seen = prompt + item["generation_token_ids"]


def _extend(running: list[str], ids: list[int], length: int, text: str | None = None) -> int:
    if ids:
        if running:
            running.append(",")
        running.append(_ids(ids) if text is None else text)
    return length + len(ids)
