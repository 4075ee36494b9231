"""A vLLM chat completion as an OpenAI Responses ``Response`` object (pure).

Guarantees:

* ``output`` is, in order: a ``reasoning`` item when there is reasoning text
  (``content: [{type: reasoning_text, text}]``, ``summary: []``), a ``message`` item when
  there is text, then one ``function_call`` item per tool call (``call_id`` = the chat
  call's id, ``arguments`` verbatim; ``namespace`` when the request offered the function
  inside a ``namespace`` tool, as the OpenAI API marks such a call). The same items the
  interceptor records as output (``producers.engine.extract.chat_output_items``), so the echo
  hashes like the captured output.
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

Tools (``chat_tools`` for the request side, ``namespace_map`` for the answer; kept here
because the answer needs the map and ``responses`` imports this module). A Responses
``namespace`` tool (``{"type": "namespace", "name": "multi_agent_v1", "tools": [<function
tools>]}``: Codex offers its sub-agent tools this way) groups function tools the model calls
by bare name, with ``"namespace": <name>`` on the ``function_call`` item. Chat completions
know no namespaces, so:

* Every function tool of a namespace becomes a chat tool under its **bare** name: the model
  sees and generates what it would against the OpenAI API, and the tokens, the recorded
  output and the harness's echo (lineage hashes ``name``, never ``namespace``) agree.
* A bare name must therefore be unique across the request: a function name that two
  namespaces, or a namespace and a top-level function tool, share raises ``DialectError``
  naming the second field (the answer could not be mapped back to one namespace). Two
  top-level tools of one name pass through as before (no namespace to recover).
* ``namespace_map`` gives each namespaced function's namespace, so the answer's
  ``function_call`` items carry ``namespace`` exactly as the harness expects.
* Hosted tools (``web_search``, ``custom``, ...), top-level or in a namespace, never reach
  the model and are skipped.
"""

from __future__ import annotations

import time
from typing import Any

from producers.dialects.common import DialectError, expect, expect_objects, read_chat_response, shown

_PREFIX = {"reasoning": "rs", "message": "msg", "function_call": "fc"}


def item_id(kind: str, response_id: str, output_index: int) -> str:
    return f"{_PREFIX[kind]}_{response_id}_{output_index}"


def reasoning_item(item_id_: str, text: str) -> dict:
    return {"type": "reasoning", "id": item_id_, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}]}


def message_item(item_id_: str, text: str | None, status: str = "completed") -> dict:
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": []}]
    return {"type": "message", "id": item_id_, "role": "assistant", "status": status, "content": content}


def function_call_item(item_id_: str, call_id: str, name: str, arguments: str, status: str = "completed",
                       namespace: str | None = None) -> dict:
    item = {"type": "function_call", "id": item_id_, "call_id": call_id, "name": name}
    if namespace is not None:
        item["namespace"] = namespace  # Codex runs a namespaced tool only when the call names its namespace
    item.update(arguments=arguments, status=status)
    return item


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
    reasoning = request.get("reasoning")
    if not isinstance(reasoning, dict):
        reasoning = {}
    text = request.get("text")
    if not isinstance(text, dict):
        text = {}
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
    namespaces = namespace_map(request.get("tools"))
    for call_id, name, arguments in out.tool_calls:
        items.append(function_call_item(item_id("function_call", response_id, len(items)), call_id, name, arguments,
                                        namespace=namespaces.get(name)))
    if status == "incomplete" and items and items[-1]["type"] != "reasoning":
        items[-1]["status"] = "incomplete"
    return response_object(request, response_id=response_id, model=model, created_at=out.created,
                           status=status, incomplete_reason=reason, output=items,
                           usage=usage(out.prompt_tokens, out.completion_tokens))


# -- tools: namespaces flattened on the way in, recovered on the way out -----------------------


def chat_tools(tools: Any) -> list[dict]:
    """The chat ``tools`` for a Responses ``tools`` list (see the module docstring)."""
    out: list[dict] = []
    seen: dict[str, str] = {}  # bare name -> the field that defined it
    for i, tool in enumerate(expect_objects(tools or [], "tools", "tool")):
        kind = tool.get("type")
        if kind == "function":
            name = _name(tool, f"tools[{i}]")
            _claim(seen, name, f"tools[{i}].name", namespaced=False)
            out.append(_chat_tool(tool, f"tools[{i}]"))
        elif kind == "namespace":
            _namespace_name(tool, i)
            for j, inner in enumerate(expect_objects(tool.get("tools") or [], f"tools[{i}].tools", "tool")):
                if inner.get("type") != "function":
                    continue
                name = _name(inner, f"tools[{i}].tools[{j}]")
                _claim(seen, name, f"tools[{i}].tools[{j}].name", namespaced=True)
                out.append(_chat_tool(inner, f"tools[{i}].tools[{j}]"))
    return out


def namespace_map(tools: Any) -> dict[str, str]:
    """``{bare function name: namespace}`` for the namespaced function tools of a checked request.

    Lenient on purpose: ``chat_tools`` has already refused a malformed list, and the answer
    side must never fail on what the request side accepted.
    """
    found: dict[str, str] = {}
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, dict) or tool.get("type") != "namespace" or not isinstance(tool.get("name"), str):
            continue
        inner_tools = tool.get("tools")
        for inner in inner_tools if isinstance(inner_tools, list) else []:
            if isinstance(inner, dict) and inner.get("type") == "function" and isinstance(inner.get("name"), str):
                found[inner["name"]] = tool["name"]
    return found


def _claim(seen: dict[str, str], name: str, where: str, *, namespaced: bool) -> None:
    earlier = seen.get(name)
    # Only a clash involving a namespaced function loses information; top-level twins keep passing.
    if earlier is not None and (namespaced or ".tools[" in earlier):
        raise DialectError(f"'{where}' = {name!r} is already defined by '{earlier}': a namespaced function tool "
                           "is sent to the model under its bare name, so function names must be unique across "
                           "namespaces and top-level tools; rename one of them")
    seen.setdefault(name, where)


def _namespace_name(tool: dict, i: int) -> str:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise DialectError(f"'tools[{i}].name' of a namespace tool must be a non-empty string, got {shown(name)}")
    return name


def _name(tool: dict, where: str) -> str:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise DialectError(f"'{where}.name': a function tool needs a non-empty string name, got {shown(name)}")
    return name


def _chat_tool(tool: dict, where: str) -> dict:
    if tool.get("parameters") is not None:  # a JSON Schema; the engine's tool parsers crash on anything else
        expect(tool["parameters"], "object", f"{where}.parameters", 'a JSON Schema, e.g. {"type": "object"}')
    function: dict[str, Any] = {"name": tool["name"]}
    for key in ("description", "parameters", "strict"):
        if tool.get(key) is not None:
            function[key] = tool[key]
    return {"type": "function", "function": function}
