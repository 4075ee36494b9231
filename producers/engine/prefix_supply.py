"""Prefix supply: the exact prompt ids of a call that continues a captured one (pure, stdlib only).

An engine renders a conversation from text, and the ids of an earlier turn can come out
different from what the model sampled (a template that drops reasoning, re-serialised tool
arguments). With prefix supply the interceptor sends the prompt ids itself, as vLLM's
``kv_transfer_params.prompt_token_ids``: the parent's cumulative ids (its prompt and its
generation, exactly as sampled), then the ids of the turns after it as the engine's own
template renders them.

The new turns are found by NeMo RL's rule (``_replace_prefix_tokens``): render (a) the
conversation through the parent's assistant message without a generation prompt, and (b)
the whole request. When the parent ended on its stop token, the new turns start right after
the last occurrence of that token in (a). When it was cut short (``length``: it sampled no
stop token), they start where the template closes the turn: the tokens that (a) shares at
its end with (c), the same render with the parent's text emptied; the template's closing
tokens then follow the parent's ids, as the engine's own render would have it.

Guarantees of ``splice``: ids are returned only when (b) starts with (a) and the parent's
turn end is found in (a); the ids then start with the parent's cumulative ids, unchanged.
Otherwise no ids, and a reason code saying why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Request fields the render route must not see: a render is not a generation (vLLM refuses
# max_tokens above max_model_len there too), and kv_transfer_params would be reused, not rendered.
_NOT_RENDERED = ("stream", "stream_options", "max_tokens", "max_completion_tokens", "kv_transfer_params")
_STOP_FINISHES = ("stop", "tool_calls")


@dataclass(frozen=True, slots=True)
class Splice:
    ids: list[int] | None
    reason: str = ""  # why there are no ids


def ends_with_stop(finish_reason: Any, stop_reason: Any) -> bool:
    """Did the generation end on a stop token (EOS or a stop token id), so that its last id is one?

    vLLM reports ``stop_reason`` None for EOS, the token id for ``stop_token_ids``, and the
    matched text for a stop string (whose ids are not a turn terminator); ``tool_calls`` is
    an engine ``stop`` whose tool calls were parsed.
    """
    if finish_reason not in _STOP_FINISHES:
        return False
    return stop_reason is None or (isinstance(stop_reason, int) and not isinstance(stop_reason, bool))


def last_assistant_index(messages: list[Any]) -> int | None:
    for i in range(len(messages) - 1, -1, -1):
        if isinstance(messages[i], dict) and messages[i].get("role") == "assistant":
            return i
    return None


def ineligible(chat_body: dict[str, Any]) -> str:
    """Why the engine would not take supplied ids for this request ("" when it would)."""
    messages = chat_body.get("messages")
    if not isinstance(messages, list) or last_assistant_index(messages) is None:
        return "no_assistant_turn"
    if chat_body.get("continue_final_message"):
        return "continues_final_message"  # a prefill continues the last message: no parent turn to splice
    return ids_refused(chat_body)


def ids_refused(chat_body: dict[str, Any]) -> str:
    """Why vLLM would ignore ``kv_transfer_params.prompt_token_ids`` on this request ("" when it takes them)."""
    if chat_body.get("echo"):
        return "echo"  # vLLM renders (ignores the ids) under echo
    for message in chat_body.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and any(not isinstance(p, dict) or p.get("type") != "text" for p in content):
            return "non_text_content"  # vLLM renders media itself and ignores supplied ids
    return ""


def render_bodies(chat_body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(a) the conversation through the parent's assistant turn, (b) the whole request, as render bodies."""
    base = {k: v for k, v in chat_body.items() if k not in _NOT_RENDERED}
    messages = base["messages"]
    cut = last_assistant_index(messages)
    assert cut is not None, "ineligible() screens requests without an assistant turn"
    through_parent = {**base, "messages": messages[: cut + 1], "add_generation_prompt": False,
                      "continue_final_message": False}
    return through_parent, base


def emptied_body(through_parent: dict[str, Any]) -> dict[str, Any]:
    """(c): render body (a) with the parent's assistant text emptied (for a parent cut short)."""
    messages = list(through_parent["messages"])
    messages[-1] = {**messages[-1], "content": ""}
    return {**through_parent, "messages": messages}


def splice(parent_ids: list[int], through_parent: list[int], full: list[int],
           emptied: list[int] | None = None) -> Splice:
    """The prompt ids: ``parent_ids`` + the ids of ``full`` after the parent's turn (see the module doc).

    ``emptied`` is render (c), given exactly when the parent was cut short (no stop token).
    """
    if not parent_ids:
        return Splice(None, "parent_has_no_ids")
    if len(full) < len(through_parent) or full[: len(through_parent)] != through_parent:
        return Splice(None, "template_not_prefix_stable")
    if emptied is not None:
        closing = _closing_len(through_parent, emptied)
        if closing == 0:
            return Splice(None, "turn_end_not_in_template")
        return Splice(list(parent_ids) + full[len(through_parent) - closing :])
    stop = parent_ids[-1]
    for k in range(len(through_parent) - 1, -1, -1):
        if through_parent[k] == stop:
            return Splice(list(parent_ids) + full[k + 1 :])
    return Splice(None, "stop_token_not_in_template")


def _closing_len(rendered: list[int], emptied: list[int]) -> int:
    """How many tokens close the parent's turn: the common tail of (a) and (c), never into their common head."""
    head = 0
    for x, y in zip(rendered, emptied):
        if x != y:
            break
        head += 1
    tail = 0
    for x, y in zip(reversed(rendered), reversed(emptied)):
        if x != y:
            break
        tail += 1
    return min(tail, len(emptied) - head)
