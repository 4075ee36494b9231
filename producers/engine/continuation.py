"""Continuing a generation the engine aborted for a weight update (``abort_policy="continue"``), pure.

vLLM's ``/pause?mode=abort`` ends every generation in flight with ``finish_reason: "abort"`` and
the tokens generated so far; requests sent while it is paused wait until ``/resume``. So a call
can be continued: resubmit its exact prompt ids followed by the partial generation as the new
prompt (``kv_transfer_params.prompt_token_ids``: no re-rendering, no re-tokenisation), with
the output budget less what was generated, and join the parts. The joined call is token-exact
by construction: each part's generated ids and log-probs are the engine's own, and a part is
accepted only if the engine reports the prompt it was given (``check_prompt``), so the
sequence ``prompt + part 1 + part 2 ...`` is what the engine conditioned every token on.

What it cannot promise, and refuses (``continuation_body`` says why; the call is then aborted
as under ``mask``): a request the engine would not take prompt ids for (media, ``echo``), a
part that already holds tool calls (the engine parses each part's text on its own, so a tool
call cut in two would reach the harness as text), routed experts (no format to join them),
and a budget already spent. A stop string that straddles the cut is not seen by the engine
(each part is checked alone): the tokens stay exact, the text may run past it.
"""

from __future__ import annotations

from typing import Any

from producers.engine.info import max_tokens_key
from producers.engine.prefix_supply import ids_refused

__all__ = ["check_prompt", "continuation_body", "join_answers", "join_weight_versions", "part_of"]


def part_of(data: dict[str, Any]) -> tuple[list[int], list[int], dict[str, Any]] | None:
    """(prompt ids, generated ids, choice) of an aborted answer; None when it carries no token ids."""
    choices = data.get("choices")
    choice = choices[0] if isinstance(choices, list) and len(choices) == 1 and isinstance(choices[0], dict) else None
    prompt = data.get("prompt_token_ids")
    generated = choice.get("token_ids") if choice is not None else None
    if not isinstance(prompt, list) or not isinstance(generated, list):
        return None
    assert choice is not None  # the generated ids are the choice's
    return prompt, generated, choice


def continuation_body(body: dict[str, Any], prompt_ids: list[int], generated: list[int],
                      message: dict[str, Any] | None, routed_experts: Any) -> dict[str, Any] | str:
    """The next part's engine request, or why the call cannot be continued."""
    why = ids_refused(body)
    if why:
        return f"the engine would not take the prompt ids ({why})"
    if message and message.get("tool_calls"):
        return "the aborted part already holds tool calls (each part is parsed alone)"
    if routed_experts is not None:
        return "routed experts cannot be joined across parts"
    out = dict(body)
    key = max_tokens_key(out)
    budget = out.get(key)
    if isinstance(budget, int) and not isinstance(budget, bool):
        if budget - len(generated) < 1:
            return f"the output budget ({key}={budget}) was spent by the {len(generated)} tokens generated"
        out[key] = budget - len(generated)
    low = out.get("min_tokens")
    if isinstance(low, int) and not isinstance(low, bool):
        out["min_tokens"] = max(0, low - len(generated))
    kv = out.get("kv_transfer_params")
    kv = dict(kv) if isinstance(kv, dict) else {}
    kv["prompt_token_ids"] = list(prompt_ids) + list(generated)
    out["kv_transfer_params"] = kv
    return out


def check_prompt(reported: Any, expected: list[int]) -> str:
    """Empty when the engine generated the part from exactly ``expected``; else what it did instead."""
    if reported == expected:
        return ""
    n = len(reported) if isinstance(reported, list) else None
    return (f"the engine reported {n} prompt ids for a continuation of {len(expected)} (prompt plus the "
            "partial generation): it did not take kv_transfer_params.prompt_token_ids")


def join_weight_versions(first: Any, second: Any, offset: int) -> Any:
    """The engine's spans of two parts as one list (the second's ``offset`` tokens later); None if either lacks them."""
    if not isinstance(first, list) or not isinstance(second, list):
        return None
    moved = [dict(s, start=s.get("start", 0) + offset, end=s.get("end", 0) + offset) if isinstance(s, dict) else s
             for s in second]
    return first + moved


def join_answers(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """One chat-completions answer of two parts: the first's prompt, both generations, the second's finish."""
    c1, c2 = first["choices"][0], second["choices"][0]
    m1: dict[str, Any] = c1.get("message") or {}
    m2: dict[str, Any] = c2.get("message") or {}
    generated = len(c1.get("token_ids") or [])
    message = dict(m2)
    for key in ("content", "reasoning", "reasoning_content"):
        parts = [m[key] for m in (m1, m2) if m.get(key)]
        if parts or key in m2:
            message[key] = "".join(parts) or None
    choice = dict(c2)
    choice["message"] = message
    choice["token_ids"] = list(c1.get("token_ids") or []) + list(c2.get("token_ids") or [])
    lp1 = (c1.get("logprobs") or {}).get("content") or []
    lp2 = (c2.get("logprobs") or {}).get("content") or []
    choice["logprobs"] = {"content": list(lp1) + list(lp2)}
    choice["weight_versions"] = join_weight_versions(c1.get("weight_versions"), c2.get("weight_versions"), generated)
    out = dict(second)
    out["choices"] = [choice]
    out["prompt_token_ids"] = first.get("prompt_token_ids")
    u1, u2 = first.get("usage") or {}, second.get("usage") or {}
    if u1 or u2:
        prompt = u1.get("prompt_tokens")
        completion = (u1.get("completion_tokens") or 0) + (u2.get("completion_tokens") or 0)
        out["usage"] = {**u2, "prompt_tokens": prompt, "completion_tokens": completion,
                        "total_tokens": (prompt or 0) + completion}
    return out
