"""A vLLM chat completion as an Anthropic Messages response (pure).

Guarantees:

* Content blocks come in the order the model produced them: a ``thinking`` block (from
  ``message.reasoning``, ``signature: ""``: there is no Anthropic signature to give), a
  ``text`` block when the text is non-empty (Anthropic refuses empty text blocks when a
  harness echoes them), then one ``tool_use`` block per tool call with the chat call's id,
  so the echo hashes like the captured output (``schemas.hashing``).
* ``tool_use.input`` is ``json.loads(arguments)``; arguments that are not a JSON object
  raise ``DialectError``: Anthropic's ``input`` must be an object, and inventing one would
  hand the harness a call the model did not make (its echo would re-render other tokens).
* ``stop_reason``: ``tool_use`` when tool calls were parsed and the model stopped by itself,
  ``max_tokens`` on ``length``, ``stop_sequence`` (with ``stop_sequence`` set) when vLLM
  reports the matched stop string, ``refusal`` on ``content_filter``, ``end_turn`` on vLLM's
  ``repetition`` (the detector ended the turn) and otherwise; other finish reasons
  (``abort``, ``error``) raise ``DialectError``.
* No token field (``prompt_token_ids``, ``token_ids``, ``logprobs``) is ever copied.
"""

from __future__ import annotations

import json
from typing import Any

from producers.dialects.common import DialectError, read_chat_response


def stop_fields(finish_reason: str, vllm_stop_reason: Any, tool_calls: bool) -> tuple[str, str | None]:
    """(Anthropic stop_reason, stop_sequence) for a chat finish."""
    if finish_reason == "length":
        return "max_tokens", None
    if finish_reason == "content_filter":
        return "refusal", None
    if finish_reason == "repetition":  # vLLM's repetition detector ended the turn
        return "end_turn", None
    if tool_calls:  # "tool_calls", or "stop" when the caller named the tool (vLLM's rule)
        return "tool_use", None
    if finish_reason == "stop" and isinstance(vllm_stop_reason, str):
        return "stop_sequence", vllm_stop_reason  # vLLM's stop_reason is the matched string
    return "end_turn", None


def usage(input_tokens: int, output_tokens: int) -> dict:
    return {"input_tokens": input_tokens, "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def tool_input(name: str, arguments: str) -> dict:
    """The tool call's ``input`` object; arguments that are not a JSON object are refused."""
    try:
        value = json.loads(arguments)
    except ValueError as exc:
        raise DialectError(f"the model's arguments for tool {name!r} are not valid JSON ({exc}): "
                           f"{arguments[:200]!r}") from None
    if not isinstance(value, dict):
        raise DialectError(f"the model's arguments for tool {name!r} are JSON but not an object: "
                           f"{arguments[:200]!r}")
    return value


def from_chat_response(chat: dict, *, response_id: str, model: str) -> dict:
    """The Anthropic ``Message`` for a vLLM chat completion (token fields ignored)."""
    out = read_chat_response(chat)
    content: list[dict] = []
    if out.reasoning:
        content.append({"type": "thinking", "thinking": out.reasoning, "signature": ""})
    if out.content:
        content.append({"type": "text", "text": out.content})
    for call_id, name, arguments in out.tool_calls:
        content.append({"type": "tool_use", "id": call_id, "name": name, "input": tool_input(name, arguments)})
    stop_reason, stop_sequence = stop_fields(out.finish_reason, out.stop_reason, bool(out.tool_calls))
    return {
        "id": response_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": usage(out.prompt_tokens, out.completion_tokens),
    }
