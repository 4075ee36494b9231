"""A vLLM chat completion as a Gemini ``GenerateContentResponse`` (pure).

Guarantees:

* ``candidates[0].content.parts`` come in the order the model produced them: a thought part
  (``{"text": reasoning, "thought": true}``, only when the request's ``thinkingConfig.includeThoughts``
  asked for thoughts, as Gemini does), a text part when the text is non-empty, then one
  ``functionCall`` part per tool call, ``{"id", "name", "args"}`` with the chat call's id, so the
  echo hashes like the captured output (``schemas.hashing``).
* ``args`` is ``json.loads(arguments)``; arguments that are not a JSON object raise ``DialectError``
  (Gemini's ``args`` is an object; inventing one would hand the harness a call the model did not make).
* ``finishReason``: ``MAX_TOKENS`` on ``length``, ``SAFETY`` on ``content_filter``, ``STOP`` otherwise
  (a stop, tool calls, vLLM's ``repetition``); other finish reasons (``abort``, ``error``) raise
  ``DialectError``.
* ``usageMetadata``: ``promptTokenCount``, ``candidatesTokenCount``, ``totalTokenCount``; when the
  engine reports ``completion_tokens_details.reasoning_tokens``, those are ``thoughtsTokenCount`` and
  not in ``candidatesTokenCount`` (Gemini's split), else every generated token is a candidate token.
* ``responseId`` is the call's response id (it names the call), ``modelVersion`` the requested model.
* No token field (``prompt_token_ids``, ``token_ids``, ``logprobs``) is ever copied.
"""

from __future__ import annotations

from typing import Any

from producers.dialects.anthropic_output import tool_input
from producers.dialects.common import read_chat_response

__all__ = ["finish_reason", "from_chat_response", "function_call", "reasoning_tokens", "usage_metadata"]


def finish_reason(chat_finish: str) -> str:
    """Gemini's ``finishReason`` for a chat finish reason the dialects can express (``common.KNOWN_FINISH_REASONS``)."""
    if chat_finish == "length":
        return "MAX_TOKENS"
    if chat_finish == "content_filter":
        return "SAFETY"
    return "STOP"


def reasoning_tokens(usage: Any) -> int | None:
    """The engine's ``completion_tokens_details.reasoning_tokens``, when it reports them."""
    details = usage.get("completion_tokens_details") if isinstance(usage, dict) else None
    value = details.get("reasoning_tokens") if isinstance(details, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def usage_metadata(prompt: int, completion: int, thoughts: int | None) -> dict[str, int]:
    out = {"promptTokenCount": prompt, "candidatesTokenCount": completion - (thoughts or 0),
           "totalTokenCount": prompt + completion}
    if thoughts:
        out["thoughtsTokenCount"] = thoughts
    return out


def function_call(call_id: str, name: str, arguments: str) -> dict:
    """A ``functionCall`` part; DialectError when the arguments are not a JSON object."""
    return {"functionCall": {"id": call_id, "name": name, "args": tool_input(name, arguments)}}


def from_chat_response(chat: dict, *, response_id: str, model: str, thoughts: bool = False) -> dict:
    """The ``GenerateContentResponse`` for a vLLM chat completion (token fields ignored)."""
    out = read_chat_response(chat)
    parts: list[dict] = []
    if thoughts and out.reasoning:
        parts.append({"text": out.reasoning, "thought": True})
    if out.content:
        parts.append({"text": out.content})
    for call_id, name, arguments in out.tool_calls:
        parts.append(function_call(call_id, name, arguments))
    return {
        "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": finish_reason(out.finish_reason),
                        "index": 0}],
        "usageMetadata": usage_metadata(out.prompt_tokens, out.completion_tokens, reasoning_tokens(chat.get("usage"))),
        "modelVersion": model,
        "responseId": response_id,
    }
