"""Google Gemini API (``generateContent``) <-> OpenAI chat completions (pure; the request side lives here).

Served for ``@google/genai``, ``google-genai`` and the Gemini CLI at
``/v1beta/models/{model}:generateContent`` and ``:streamGenerateContent?alt=sse``: the model and
whether the call streams are in the path (``registry.DialectSpec.match``), not in the body. The
answer side is in ``google_output`` and ``google_stream`` (re-exported here); tools and
``generationConfig`` are translated by ``google_config``.

Guarantees of ``to_chat_request``:

* ``systemInstruction`` (its text parts joined with ``"\\n"``) becomes a leading system message;
  ``contents`` become chat messages in order. Role ``user`` (or none, as the API allows) is a user
  message, ``model`` an assistant message; any other role is refused.
* A ``model`` content is ONE assistant message: its ``thought: true`` parts are the ``reasoning``
  (concatenated), its other text parts the content (concatenated: the model generated one text;
  the Gemini CLI merges streamed text parts the same way), its ``functionCall`` parts the tool calls
  whose ``arguments`` is ``json.dumps(args, ensure_ascii=False)`` (as the Anthropic dialect
  serialises ``input``, so the echo re-renders token-identically). ``thoughtSignature`` is opaque
  Google data and never reaches the upstream.
* A ``user`` content's ``functionResponse`` parts become ``role: "tool"`` messages (content
  ``json.dumps(response, ensure_ascii=False)``: the structured result, as Gemini models receive it),
  placed before the rest of the content, which must follow them (as the Anthropic dialect requires
  of tool results). Text-only rest becomes one string joined with ``"\\n"`` (vLLM's own join);
  ``inlineData`` images become ``image_url`` parts.
* Tool call ids: a ``functionCall`` keeps its ``id`` (the answers hand out the engine's tool call
  ids; the Gemini CLI and the SDKs send them back), and a ``functionResponse`` its ``id``. A
  ``functionCall`` without one gets ``call_<content index>_<part index>``, and a
  ``functionResponse`` without one answers the first unanswered call of the same name in the
  model content before it, taking its id: deterministic, so every turn re-renders alike. (A
  harness that drops ids unlinks lineage: the captured answer's calls carry the engine's ids.)
* A trailing ``model`` content is continued (``continue_final_message``), as Anthropic prefill is.
* ``cachedContent`` is refused (token capture needs the full input in every request); other
  untranslated top-level keys (``safetySettings``, ``labels``) are dropped, ``dropped_keys`` lists
  them; a part kind or field that cannot be expressed is refused, naming ``contents[i].parts[j]``.
* Streaming asks for ``stream_options.include_usage`` (the last chunk carries ``usageMetadata``).
* Every field is read under its JSON name or its proto name (``google_names.normalize``: the API
  accepts both, and google-genai sends ``parameters_json_schema``).
"""

from __future__ import annotations

import json
from typing import Any

from producers.dialects.common import DialectError, expect, expect_objects, join_text, shown
from producers.dialects.google_config import chat_tools, generation_settings, tool_choice
from producers.dialects.google_names import normalize
from producers.dialects.google_output import from_chat_response
from producers.dialects.google_stream import StreamTranslator

__all__ = ["DialectError", "StreamTranslator", "count_chat_request", "dropped_keys", "from_chat_response",
           "hash_items", "normalize", "request_settings", "system_text", "to_chat_request"]

TRANSLATED_KEYS = frozenset({"contents", "systemInstruction", "tools", "toolConfig", "generationConfig"})
_PART_DATA = ("text", "inlineData", "fileData", "functionCall", "functionResponse", "executableCode",
              "codeExecutionResult")
_PART_META = frozenset({"thought", "thoughtSignature"})  # a signature is opaque Google data: never sent upstream


def dropped_keys(body: dict) -> list[str]:
    """Request keys ``to_chat_request`` does not send upstream (``safetySettings``, ``labels``, ...)."""
    body = normalize(body)
    out = [k for k in body if k not in TRANSLATED_KEYS]
    config = body.get("toolConfig")
    if isinstance(config, dict):
        out += [f"toolConfig.{k}" for k in config if k != "functionCallingConfig"]
    return out


def request_settings(alt: str | None, stream_path: bool) -> bool:
    """Whether the call streams, from its path and its query's ``alt``; DialectError for an ``alt`` this dialect
    cannot serve.

    ``:streamGenerateContent`` is served as SSE only (``alt=sse``, what every Google SDK sends); its JSON-array
    form (no ``alt``) is refused rather than answered in a shape the client did not ask for."""
    if stream_path and alt != "sse":
        raise DialectError(f"streamGenerateContent is served as server-sent events only: add '?alt=sse' to the URL "
                           f"(the Google SDKs do), got alt={alt!r}")
    if not stream_path and alt not in (None, "json"):
        raise DialectError(f"generateContent answers JSON: 'alt' must be json or absent, got alt={alt!r}")
    return stream_path


def to_chat_request(body: dict, *, model: str | None = None, stream: bool = False) -> dict:
    """The chat-completions request for a Gemini ``generateContent`` request (see the module docstring)."""
    if not isinstance(body, dict):
        raise DialectError("the Gemini request body must be a JSON object")
    body = normalize(body)
    if body.get("cachedContent") is not None:
        raise DialectError("'cachedContent' is not supported: token capture needs the full input in every request; "
                           "send the cached contents in 'contents' instead")
    contents = _contents(body)
    out: dict[str, Any] = {}
    if model is not None:
        out["model"] = model
    chat: list[dict] = []
    system = system_text(body.get("systemInstruction"))
    if system is not None:
        chat.append({"role": "system", "content": system})
    chat.extend(_messages(contents))
    out["messages"] = chat
    if chat and chat[-1]["role"] == "assistant":
        out["continue_final_message"] = True  # the answer continues the trailing model turn
        out["add_generation_prompt"] = False
    settings, _ = generation_settings(body.get("generationConfig"))
    out.update(settings)
    if stream:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}  # the last chunk carries usageMetadata
    tools = chat_tools(body.get("tools"))
    config = body.get("toolConfig")
    if config is not None:
        expect(config, "object", "toolConfig", 'e.g. {"functionCallingConfig": {"mode": "AUTO"}}')
    if tools:
        out["tools"] = tools
        choice = tool_choice(config.get("functionCallingConfig") if config else None,
                             [t["function"]["name"] for t in tools])
        if choice is not None:
            out["tool_choice"] = choice
    return out


def count_chat_request(body: dict, *, model: str | None = None) -> dict:
    """The chat request whose rendered prompt ``countTokens`` counts: ``{"contents": ...}`` or
    ``{"generateContentRequest": {...}}`` (then its system instruction and tools count too)."""
    body = normalize(body)
    inner = body.get("generateContentRequest")
    if inner is not None:
        expect(inner, "object", "generateContentRequest", "a generateContent request body")
        if body.get("contents") is not None:
            raise DialectError("send 'contents' or 'generateContentRequest', not both")
        body = inner
    chat = to_chat_request(body, model=model)
    return {k: chat[k] for k in ("model", "messages", "tools", "chat_template_kwargs", "add_generation_prompt",
                                 "continue_final_message") if k in chat}


def system_text(system: Any) -> str | None:
    """``systemInstruction`` as one string (its text parts joined with ``"\\n"``; its role is ignored), or None."""
    if system is None:
        return None
    if isinstance(system, str):
        return system
    expect(system, "object", "systemInstruction", 'a Content object, e.g. {"parts": [{"text": "..."}]}')
    texts = []
    for j, part in enumerate(expect_objects(system.get("parts") or [], "systemInstruction.parts", "part")):
        text = part.get("text")
        if not isinstance(text, str) or part.get("thought") or set(part) - {"text", "thoughtSignature"}:
            raise DialectError(f"'systemInstruction.parts[{j}]' must be a text part such as {{\"text\": \"...\"}}, "
                               f"got {shown(part)}")
        texts.append(text)
    return join_text(texts)


def _contents(body: dict) -> list[dict]:
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        raise DialectError(f"'contents' must be a non-empty list of Content objects, got {shown(contents)}")
    for i, content in enumerate(expect_objects(contents, "contents", "Content")):
        role = content.get("role")
        if role not in (None, "", "user", "model", "function"):
            raise DialectError(f"'contents[{i}].role' must be user or model, got {shown(role)}")
        parts = content.get("parts")
        if not isinstance(parts, list) or not parts:
            raise DialectError(f"'contents[{i}].parts' must be a non-empty list of parts, got {shown(parts)}")
        for j, part in enumerate(expect_objects(parts, f"contents[{i}].parts", "part")):
            data = [k for k in part if k in _PART_DATA]
            extra = sorted(set(part) - set(_PART_DATA) - _PART_META)
            if len(data) != 1 or extra:
                raise DialectError(f"'contents[{i}].parts[{j}]' must hold exactly one of {', '.join(_PART_DATA)} "
                                   f"(plus thought, thoughtSignature), got keys {sorted(part)}")
    return contents


def _messages(contents: list[dict]) -> list[dict]:
    messages: list[dict] = []
    pending: list[tuple[str, str]] = []  # (name, id) of the last model content's unanswered calls
    for i, content in enumerate(contents):
        if content.get("role") == "model":
            message, pending = _model(content["parts"], i)
            messages.append(message)
        else:
            messages.extend(_user(content["parts"], i, pending))
    return messages


def _model(parts: list[dict], i: int) -> tuple[dict, list[tuple[str, str]]]:
    reasoning: list[str] = []
    texts: list[str] = []
    calls: list[dict] = []
    for j, part in enumerate(parts):
        where = f"contents[{i}].parts[{j}]"
        if "text" in part:
            text = expect(part["text"], "string", f"{where}.text")
            (reasoning if _thought(part, where) else texts).append(text)
        elif "functionCall" in part:
            call = expect(part["functionCall"], "object", f"{where}.functionCall", '{"name": ..., "args": {...}}')
            name = call.get("name")
            if not isinstance(name, str) or not name:
                raise DialectError(f"'{where}.functionCall.name' must be a non-empty string, got {shown(name)}")
            args = expect(call.get("args") if call.get("args") is not None else {}, "object",
                          f"{where}.functionCall.args", "the call's arguments object")
            call_id = call.get("id") or f"call_{i}_{j}"
            expect(call_id, "string", f"{where}.functionCall.id")
            calls.append({"id": call_id, "type": "function",
                          "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}})
        else:
            raise DialectError(f"'{where}' is a {_kind(part)} part, which a model content cannot hold here "
                               "(model contents may hold text, thought and functionCall parts)")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    if reasoning:
        message["reasoning"] = "".join(reasoning)
    return message, [(c["function"]["name"], c["id"]) for c in calls]


def _user(parts: list[dict], i: int, pending: list[tuple[str, str]]) -> list[dict]:
    out: list[dict] = []
    rest: list[dict] = []
    for j, part in enumerate(parts):
        where = f"contents[{i}].parts[{j}]"
        if "functionResponse" in part:
            if rest:
                raise DialectError(f"'{where}': functionResponse parts must come first in a user content, before "
                                   "its text and media parts")
            out.append(_tool_result(part["functionResponse"], where, pending))
        elif "text" in part:
            if _thought(part, where):
                raise DialectError(f"'{where}' is a thought part, which only a model content can hold")
            rest.append({"type": "text", "text": expect(part["text"], "string", f"{where}.text")})
        elif "inlineData" in part:
            rest.append({"type": "image_url", "image_url": {"url": _image_url(part["inlineData"], where)}})
        else:
            raise DialectError(f"'{where}' is a {_kind(part)} part, which cannot be sent to a chat model (user "
                               "contents may hold text, inlineData images and functionResponse parts)")
    if rest:
        content: Any = (join_text([p["text"] for p in rest]) if all(p["type"] == "text" for p in rest) else rest)
        out.append({"role": "user", "content": content})
    return out


def _tool_result(response: Any, where: str, pending: list[tuple[str, str]]) -> dict:
    expect(response, "object", f"{where}.functionResponse", '{"id": ..., "name": ..., "response": {...}}')
    name = response.get("name")
    if not isinstance(name, str) or not name:
        raise DialectError(f"'{where}.functionResponse.name' must be a non-empty string, got {shown(name)}")
    extra = sorted(set(response) - {"id", "name", "response"})
    if extra:
        raise DialectError(f"'{where}.functionResponse.{extra[0]}' cannot be sent to a chat model (a chat tool "
                           "result is text: send id, name and response only)")
    result = expect(response.get("response") if response.get("response") is not None else {}, "object",
                    f"{where}.functionResponse.response", 'e.g. {"output": "..."}')
    call_id = response.get("id")
    if call_id:
        expect(call_id, "string", f"{where}.functionResponse.id")
        pending[:] = [p for p in pending if p[1] != call_id]
    else:
        match = next((p for p in pending if p[0] == name), None)
        if match is None:
            raise DialectError(f"'{where}.functionResponse' has no id and answers no unanswered call of {name!r} in "
                               "the model content before it: send the functionCall's id")
        pending.remove(match)
        call_id = match[1]
    return {"role": "tool", "tool_call_id": call_id, "content": json.dumps(result, ensure_ascii=False)}


def _thought(part: dict, where: str) -> bool:
    return bool(expect(part.get("thought", False), "boolean", f"{where}.thought"))


def _image_url(data: Any, where: str) -> str:
    expect(data, "object", f"{where}.inlineData", '{"mimeType": "image/png", "data": "<base64>"}')
    mime, payload = data.get("mimeType"), data.get("data")
    if not isinstance(mime, str) or not mime.startswith("image/") or not isinstance(payload, str):
        raise DialectError(f"'{where}.inlineData' must be an image: a mimeType image/... and base64 'data', got "
                           f"mimeType {shown(mime)}")
    return f"data:{mime};base64,{payload}"


def _kind(part: dict) -> str:
    return next((k for k in part if k in _PART_DATA), "empty")


def hash_items(body: dict) -> tuple[list[dict], Any, Any]:
    """(items, instructions, tools) the interceptor hashes for lineage (``schemas.hashing``).

    Items are the chat messages ``contents`` translate to (without the system message): they hash like the
    engine's answer (``producers.engine.extract.chat_output_items``) when the harness echoes it, tool calls
    by their ids; reasoning is not hashed, so dropped thought parts (the Gemini CLI drops them) change nothing.
    Instructions are ``system_text``; tools are the request's ``tools`` as given.
    """
    body = normalize(body)
    return _messages(_contents(body)), system_text(body.get("systemInstruction")), body.get("tools")
