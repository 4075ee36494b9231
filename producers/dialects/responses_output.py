"""A vLLM chat completion as an OpenAI Responses ``Response`` object (pure).

Guarantees:

* ``output`` is, in order: a ``reasoning`` item when there is reasoning text
  (``content: [{type: reasoning_text, text}]``, ``summary: []``), a ``message`` item when
  there is text, then one ``function_call`` item per tool call (``call_id`` = the chat
  call's id, ``arguments`` verbatim). The same items the interceptor records as output
  (``producers.extract.chat_output_items``), so the echo hashes like the captured output.
* Item ids are deterministic: ``rs_`` / ``msg_`` / ``fc_`` + ``<response_id>_<output index>``;
  a stream of the same generation yields the same ids (``responses_stream``).
* ``status`` is ``completed``, or ``incomplete`` with ``incomplete_details.reason``
  ``max_output_tokens`` (finish ``length``; the last item is then ``incomplete`` too) or
  ``content_filter``; vLLM's ``repetition`` (its detector ended the turn) is ``completed``.
  Other finish reasons raise ``DialectError``.
* The envelope echoes the request's settings (instructions, tools, tool_choice, sampling,
  ...) with the defaults the OpenAI API reports, and satisfies the OpenAI SDK's ``Response``
  model. ``store`` is reported false: nothing is stored, whatever was asked.
* No token field is ever copied.
"""

from __future__ import annotations

import time

from producers.dialects.common import DialectError, read_chat_response

_PREFIX = {"reasoning": "rs", "message": "msg", "function_call": "fc"}


def item_id(kind: str, response_id: str, output_index: int) -> str:
    return f"{_PREFIX[kind]}_{response_id}_{output_index}"


def reasoning_item(item_id_: str, text: str) -> dict:
    return {"type": "reasoning", "id": item_id_, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}]}


def message_item(item_id_: str, text: str | None, status: str = "completed") -> dict:
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": []}]
    return {"type": "message", "id": item_id_, "role": "assistant", "status": status, "content": content}


def function_call_item(item_id_: str, call_id: str, name: str, arguments: str, status: str = "completed") -> dict:
    return {"type": "function_call", "id": item_id_, "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def status_of(finish_reason: str) -> tuple[str, str | None]:
    """(status, incomplete_details.reason) for a chat finish reason."""
    if finish_reason == "length":
        return "incomplete", "max_output_tokens"
    if finish_reason == "content_filter":
        return "incomplete", "content_filter"
    if finish_reason in ("stop", "tool_calls", "repetition"):
        return "completed", None
    raise DialectError(f"upstream finish_reason {finish_reason!r} has no Responses equivalent")


def usage(input_tokens: int, output_tokens: int) -> dict:
    # vLLM reports neither cached nor reasoning token counts separately.
    return {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens}


def response_object(request: dict, *, response_id: str, model: str, created_at: int | None, status: str,
                    output: list[dict], usage: dict | None = None,
                    incomplete_reason: str | None = None) -> dict:
    """The full ``Response`` envelope around ``output``, echoing the request's settings."""
    reasoning = request.get("reasoning") if isinstance(request.get("reasoning"), dict) else {}
    text = request.get("text") if isinstance(request.get("text"), dict) else {}
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at if created_at is not None else int(time.time()),
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "max_tool_calls": request.get("max_tool_calls"),
        "model": model,
        "output": output,
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "prompt_cache_key": request.get("prompt_cache_key"),
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "safety_identifier": request.get("safety_identifier"),
        "service_tier": "default",
        "store": False,
        "temperature": request.get("temperature", 1.0),
        "text": {"format": {"type": "text"}, **text},
        "tool_choice": request.get("tool_choice", "auto"),
        "tools": request.get("tools") or [],
        "top_p": request.get("top_p", 1.0),
        "truncation": request.get("truncation", "disabled"),
        "usage": usage,
        "user": request.get("user"),
        "metadata": request.get("metadata") or {},
    }


def from_chat_response(chat: dict, *, response_id: str, model: str, request: dict) -> dict:
    """The ``Response`` for a vLLM chat completion answering ``request`` (token fields ignored)."""
    out = read_chat_response(chat)
    status, reason = status_of(out.finish_reason)
    items: list[dict] = []
    if out.reasoning:
        items.append(reasoning_item(item_id("reasoning", response_id, len(items)), out.reasoning))
    if out.content:
        items.append(message_item(item_id("message", response_id, len(items)), out.content))
    for call_id, name, arguments in out.tool_calls:
        items.append(function_call_item(item_id("function_call", response_id, len(items)), call_id, name, arguments))
    if status == "incomplete" and items and items[-1]["type"] != "reasoning":
        items[-1]["status"] = "incomplete"
    return response_object(request, response_id=response_id, model=model, created_at=out.created,
                           status=status, incomplete_reason=reason, output=items,
                           usage=usage(out.prompt_tokens, out.completion_tokens))
