"""Gemini request settings in chat-completions terms: tools, tool config, generation config (pure).

The Gemini API (``generateContent``) puts its sampling settings in ``generationConfig`` and its
functions in ``tools[].functionDeclarations``; this module translates both, and
``toolConfig.functionCallingConfig``, for ``producers.dialects.google``.

Guarantees:

* A function's parameters go upstream as a JSON Schema object: ``parametersJsonSchema`` as
  given; ``parameters`` (Gemini's OpenAPI-subset ``Schema``) with its ``type`` names lower-cased
  (``OBJECT`` -> ``object``) and ``nullable: true`` written as JSON Schema's ``[type, "null"]``,
  recursively (``properties``, ``items``, ``anyOf``); every other keyword as given. Parameters
  that are not an object, or whose type is not ``object``, are a ``DialectError`` naming the
  declaration (the engine's tool parsers need an object schema).
* Hosted tools (``googleSearch``, ``codeExecution``, ``urlContext``, ...) run at Google and are
  skipped, as the Anthropic dialect skips server tools; a key of a tool object that is neither
  is refused.
* ``generationConfig``: ``temperature``, ``topP``, ``topK``, ``maxOutputTokens``, ``stopSequences``,
  ``seed``, ``presencePenalty``, ``frequencyPenalty`` map to their chat names; ``candidateCount``
  must be 1 (token capture needs one choice); ``responseMimeType`` ``application/json`` with
  ``responseJsonSchema`` or ``responseSchema`` becomes a ``json_schema`` response format (without
  a schema, ``json_object``); ``thinkingConfig.thinkingBudget: 0`` turns thinking off, another
  budget or a ``thinkingLevel`` turns it on (the budget itself is not enforced: vLLM 0.33 has no
  thinking budget); ``includeThoughts`` says whether the answer shows thought parts. Anything
  else (log-probs, other modalities, speech, media settings) is a ``DialectError`` naming it.
"""

from __future__ import annotations

from typing import Any

from producers.dialects.common import DialectError, expect, expect_objects, shown

__all__ = ["HOSTED_TOOLS", "chat_tools", "generation_settings", "tool_choice"]

# Tools that run at Google, never at a model behind tokentrail (skipped, like Anthropic's server tools).
HOSTED_TOOLS = frozenset({"googleSearch", "googleSearchRetrieval", "codeExecution", "urlContext", "retrieval",
                          "fileSearch", "googleMaps", "enterpriseWebSearch", "computerUse"})
_DECLARATION_KEYS = frozenset({"name", "description", "parameters", "parametersJsonSchema"})
_SCHEMA_TYPES = frozenset({"string", "number", "integer", "boolean", "array", "object", "null"})
_PARAMETERS_HINT = 'a JSON Schema object, e.g. {"type": "object", "properties": {}}'

# generationConfig key -> (chat key, JSON kind)
_SAMPLING = {"temperature": ("temperature", "number"), "topP": ("top_p", "number"), "topK": ("top_k", "integer"),
             "maxOutputTokens": ("max_tokens", "integer"), "seed": ("seed", "integer"),
             "presencePenalty": ("presence_penalty", "number"), "frequencyPenalty": ("frequency_penalty", "number")}
_OTHER_KEYS = ("stopSequences", "candidateCount", "responseMimeType", "responseSchema", "responseJsonSchema",
               "thinkingConfig", "responseModalities")
_SUPPORTED = ", ".join([*_SAMPLING, *_OTHER_KEYS])


def chat_tools(tools: Any) -> list[dict]:
    """Chat function tools of ``tools[].functionDeclarations`` (hosted tools skipped); names are unique."""
    out: list[dict] = []
    seen: set[str] = set()
    for i, tool in enumerate(expect_objects(tools if tools is not None else [], "tools", "tool")):
        for key in tool:
            if key != "functionDeclarations" and key not in HOSTED_TOOLS:
                raise DialectError(f"'tools[{i}].{key}' is not a tool this interceptor can offer a local model "
                                   "(expected functionDeclarations, or a hosted tool such as googleSearch, which is "
                                   "skipped)")
        declarations = tool.get("functionDeclarations")
        if declarations is None:
            continue
        for j, declaration in enumerate(expect_objects(declarations, f"tools[{i}].functionDeclarations",
                                                       "function declaration")):
            function = _function(declaration, f"tools[{i}].functionDeclarations[{j}]")
            if function["name"] in seen:
                raise DialectError(f"function {function['name']!r} is declared twice "
                                   f"(tools[{i}].functionDeclarations[{j}]); function names must be unique")
            seen.add(function["name"])
            out.append({"type": "function", "function": function})
    return out


def _function(declaration: dict, where: str) -> dict:
    extra = sorted(set(declaration) - _DECLARATION_KEYS)
    if extra:
        raise DialectError(f"'{where}.{extra[0]}' cannot be expressed as a chat function tool (a declaration may "
                           f"have {', '.join(sorted(_DECLARATION_KEYS))}); remove it")
    name = declaration.get("name")
    if not isinstance(name, str) or not name:
        raise DialectError(f"'{where}.name' must be a non-empty string, got {shown(name)}")
    function: dict[str, Any] = {"name": name}
    if declaration.get("description") is not None:
        function["description"] = expect(declaration["description"], "string", f"{where}.description")
    schema, plain = declaration.get("parameters"), declaration.get("parametersJsonSchema")
    if schema is not None and plain is not None:
        raise DialectError(f"'{where}' has both 'parameters' and 'parametersJsonSchema'; send one of them")
    if plain is not None:
        function["parameters"] = _object_schema(plain, f"{where}.parametersJsonSchema")
    elif schema is not None:
        function["parameters"] = _object_schema(json_schema(schema, f"{where}.parameters"), f"{where}.parameters")
    return function


def _object_schema(schema: Any, where: str) -> dict:
    expect(schema, "object", where, _PARAMETERS_HINT)
    if schema.get("type", "object") != "object":
        raise DialectError(f"'{where}.type' must be object (a function's arguments are an object), got "
                           f"{shown(schema.get('type'))}")
    return schema


def json_schema(schema: Any, where: str) -> Any:
    """A Gemini ``Schema`` as JSON Schema: type names lower-cased, ``nullable`` as a ``"null"`` type."""
    expect(schema, "object", where, _PARAMETERS_HINT)
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "nullable":
            continue
        if key == "type":
            kind = value.lower() if isinstance(value, str) else value
            if kind not in _SCHEMA_TYPES:
                raise DialectError(f"'{where}.type' must be one of {', '.join(sorted(t.upper() for t in _SCHEMA_TYPES))}"
                                   f", got {shown(value)}")
            out["type"] = [kind, "null"] if schema.get("nullable") is True and kind != "null" else kind
        elif key == "properties":
            expect(value, "object", f"{where}.properties", "property name -> Schema")
            out[key] = {name: json_schema(inner, f"{where}.properties.{name}") for name, inner in value.items()}
        elif key == "items":
            out[key] = json_schema(value, f"{where}.items")
        elif key == "anyOf":
            out[key] = [json_schema(inner, f"{where}.anyOf[{n}]")
                        for n, inner in enumerate(expect_objects(value, f"{where}.anyOf", "Schema"))]
        else:
            out[key] = value
    return out


def tool_choice(config: Any, names: list[str]) -> Any:
    """The chat ``tool_choice`` of ``toolConfig.functionCallingConfig`` (None: the engine's default)."""
    if config is None:
        return None
    expect(config, "object", "toolConfig.functionCallingConfig", 'e.g. {"mode": "AUTO"}')
    mode = config.get("mode") or "MODE_UNSPECIFIED"
    allowed = config.get("allowedFunctionNames")
    if allowed is not None:
        expect(allowed, "array", "toolConfig.functionCallingConfig.allowedFunctionNames", "a list of function names")
    if mode in ("AUTO", "MODE_UNSPECIFIED", "NONE") and allowed:
        raise DialectError(f"'toolConfig.functionCallingConfig.allowedFunctionNames' needs mode ANY (got mode "
                           f"{mode}): chat can restrict a call to one named function only when one is required")
    if mode in ("AUTO", "MODE_UNSPECIFIED"):
        return "auto"
    if mode == "NONE":
        return "none"
    if mode == "ANY":
        if not allowed:
            return "required"
        if len(allowed) == 1 and allowed[0] in names:
            return {"type": "function", "function": {"name": allowed[0]}}
        raise DialectError(f"'toolConfig.functionCallingConfig.allowedFunctionNames' {allowed!r} cannot be expressed "
                           "in chat: name exactly one declared function, or none (any function)")
    raise DialectError(f"'toolConfig.functionCallingConfig.mode' {mode!r} cannot be served (expected AUTO, ANY or NONE;"
                       " VALIDATED has no chat equivalent)")


def generation_settings(config: Any) -> tuple[dict[str, Any], bool]:
    """(chat fields of ``generationConfig``, whether the answer shows thought parts)."""
    if config is None:
        return {}, False
    expect(config, "object", "generationConfig", 'e.g. {"temperature": 0.7, "maxOutputTokens": 1024}')
    out: dict[str, Any] = {}
    for key, value in config.items():
        where = f"generationConfig.{key}"
        if value is None:
            continue
        if key == "topK":  # google-genai sends it as a float (64.0): an integral number is the integer
            if not isinstance(expect(value, "number", where), int) and not float(value).is_integer():
                raise DialectError(f"'{where}' must be a whole number, got {shown(value)}")
            out["top_k"] = int(value)
        elif key in _SAMPLING:
            chat_key, kind = _SAMPLING[key]
            out[chat_key] = expect(value, kind, where)
        elif key == "stopSequences":
            out["stop"] = [expect(s, "string", f"{where}[{n}]") for n, s in enumerate(expect(value, "array", where))]
        elif key == "candidateCount":
            if value != 1:
                raise DialectError(f"'{where}' must be 1, got {shown(value)}: token capture needs exactly one "
                                   "candidate per call")
        elif key == "responseModalities":
            if [str(m).upper() for m in expect(value, "array", where)] not in ([], ["TEXT"]):
                raise DialectError(f"'{where}' {value!r} cannot be served: a chat model answers text only (send "
                                   '["TEXT"] or leave it out)')
        elif key not in ("responseMimeType", "responseSchema", "responseJsonSchema", "thinkingConfig"):
            raise DialectError(f"'{where}' cannot be served by this interceptor (supported: {_SUPPORTED}); remove it")
    response_format = _response_format(config)
    if response_format is not None:
        out["response_format"] = response_format
    thinking = config.get("thinkingConfig")
    include = False
    if thinking is not None:
        expect(thinking, "object", "generationConfig.thinkingConfig", 'e.g. {"includeThoughts": true}')
        include = bool(expect(thinking.get("includeThoughts", False), "boolean",
                              "generationConfig.thinkingConfig.includeThoughts"))
        budget = thinking.get("thinkingBudget")
        if budget is not None:
            expect(budget, "integer", "generationConfig.thinkingConfig.thinkingBudget", "0 turns thinking off")
            out["chat_template_kwargs"] = {"enable_thinking": budget != 0}
        elif thinking.get("thinkingLevel") is not None:
            out["chat_template_kwargs"] = {"enable_thinking": True}
    return out, include


def _response_format(config: dict) -> dict | None:
    mime = config.get("responseMimeType")
    schema, plain = config.get("responseSchema"), config.get("responseJsonSchema")
    if mime in (None, "text/plain"):
        if schema is not None or plain is not None:
            raise DialectError("'generationConfig.responseSchema' / 'responseJsonSchema' need responseMimeType "
                               f"application/json, got {shown(mime)}")
        return None
    if mime != "application/json":
        raise DialectError(f"'generationConfig.responseMimeType' {mime!r} cannot be served (expected text/plain or "
                           "application/json)")
    if schema is not None and plain is not None:
        raise DialectError("'generationConfig' has both responseSchema and responseJsonSchema; send one of them")
    if plain is None and schema is None:
        return {"type": "json_object"}
    value = plain if plain is not None else json_schema(schema, "generationConfig.responseSchema")
    expect(value, "object", "generationConfig.responseJsonSchema", "a JSON Schema object")
    return {"type": "json_schema", "json_schema": {"name": "response", "schema": value}}
