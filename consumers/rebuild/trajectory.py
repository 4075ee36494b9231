"""The compact trajectory of one chain and the Responses projection (pure).

The compact form is O(tokens): the ids once, a one-byte loss mask (1 where the
policy generated the token), one log-prob per generated token, and per-call
spans. The projection is NeMo RL's ``response.output`` shape, where every
token-bearing item repeats the running prompt: it grows with calls × tokens,
so sinks may turn it off.

Both verify what they deliver: the running length must equal each call's
``cum_len``, the whole sequence must hash to the last call's digest (so the
concatenated deltas are exactly the tokens the engine saw), and the projected
prompts must be contiguous.
"""

from __future__ import annotations

import json
from typing import Any

from consumers.rebuild.graph import Node
from schemas.errors import ContractError
from schemas.hashing import compute_digest
from schemas.records import CallSpan, Trajectory

_TOKEN_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs", "routed_experts")


class ChainError(ContractError):
    """A chain cannot be delivered token-exact (length, digest or contiguity violation)."""


def chain_trajectory(chain: list[Node]) -> Trajectory:
    """The compact trajectory of a root-to-leaf chain, verified against the captured digests."""
    token_ids: list[int] = []
    mask = bytearray()
    log_probs: list[float] = []
    spans: list[CallSpan] = []
    for node in chain:
        start = len(token_ids)
        token_ids.extend(node.delta)
        generation_start = len(token_ids)
        token_ids.extend(node.generation)
        mask.extend(b"\x00" * (generation_start - start))
        mask.extend(b"\x01" * len(node.generation))
        log_probs.extend(node.call.generation_log_probs)
        if len(token_ids) != node.call.cum_len:
            raise ChainError(
                f"call {node.call_id}: rebuilt {len(token_ids)} tokens but the capture recorded "
                f"cum_len={node.call.cum_len}; the chain is not contiguous"
            )
        spans.append(
            CallSpan(
                model_call_id=node.call_id,
                start=start,
                generation_start=generation_start,
                end=len(token_ids),
                policy_version=node.call.facts.policy_version,
            )
        )
    if compute_digest(token_ids) != chain[-1].call.digest:
        raise ChainError(
            f"chain ending at call {chain[-1].call_id} does not hash to its captured digest: "
            "the rebuilt tokens are not the tokens the engine saw"
        )
    return Trajectory(
        token_ids=token_ids, loss_mask=bytes(mask), log_probs=log_probs, prompt_len=len(chain[0].delta), spans=spans
    )


def project_response(chain: list[Node], rollout_id: str) -> dict[str, Any]:
    """NeMo RL-compatible Responses projection of a chain (token fields on the carrier items)."""
    cumulative: list[int] = []
    output: list[dict[str, Any]] = []
    for node in chain:
        cumulative.extend(node.delta)
        items = [_strip(item) for item in json.loads(node.call.output_items_json)]
        index = node.call.token_item_index
        if not items:
            items = [{"type": "message", "role": "assistant", "content": []}]
            index = 0
        elif index is None or not 0 <= index < len(items):
            index = len(items) - 1
        carrier = items[index]
        carrier["prompt_token_ids"] = list(cumulative)
        carrier["generation_token_ids"] = list(node.generation)
        carrier["generation_log_probs"] = list(node.call.generation_log_probs)
        if node.call.routed_experts_json is not None:
            carrier["routed_experts"] = json.loads(node.call.routed_experts_json)
        output.extend(items)
        cumulative.extend(node.generation)
    model = chain[-1].call.model or chain[-1].call.facts.served_model
    response = {
        "id": f"proj-{rollout_id}",
        "object": "response",
        "model": model,
        "output": output,
        "usage": {
            "input_tokens": len(chain[0].delta),
            "output_tokens": sum(len(n.generation) for n in chain),
        },
    }
    assert_prefix_contiguity(output)
    return response


def assert_prefix_contiguity(output: list[dict[str, Any]]) -> None:
    """Each token-bearing item's prompt must start with everything delivered before it."""
    seen: list[int] | None = None
    for position, item in enumerate(output):
        if "generation_token_ids" not in item:
            continue
        prompt = item["prompt_token_ids"]
        if seen is not None and prompt[: len(seen)] != seen:
            raise ChainError(f"output item {position}: prompt_token_ids do not extend the previous prompt + generation")
        seen = prompt + item["generation_token_ids"]


def _strip(item: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in item.items() if k not in _TOKEN_FIELDS}
