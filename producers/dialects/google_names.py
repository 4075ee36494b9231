"""Gemini field names as the API reads them: a proto field's snake_case name means its lowerCamelCase one (pure).

Google's API front end parses request JSON with proto3's JSON mapping, which accepts a field under its
JSON name (``parametersJsonSchema``) and under its proto name (``parameters_json_schema``); clients send
both (google-genai 3.x sends ``parameters_json_schema`` and ``thinkingConfig.include_thoughts``, the
Gemini CLI camelCase). ``normalize`` rewrites a request's message fields to the JSON names once, so the
translator reads one spelling.

Guarantees:

* Only the keys of the request's messages are renamed (the request, ``Content``, ``Part``,
  ``FunctionCall``, ``FunctionResponse``, ``Blob``, ``Tool``, ``FunctionDeclaration``, ``Schema``,
  ``ToolConfig``, ``GenerationConfig``, ``ThinkingConfig``); free-form values (``functionCall.args``,
  ``functionResponse.response``, ``parametersJsonSchema``, ``responseJsonSchema``, a ``Schema``'s
  property names) are never touched.
* A message that spells one field both ways is a ``DialectError`` naming both (fail closed: the API
  would take one of them, and which one is not ours to guess).
* The input is not mutated; values of the wrong JSON type are left as they are, for the translator's
  checks to name.
"""

from __future__ import annotations

from typing import Any

from producers.dialects.common import DialectError

__all__ = ["json_name", "normalize"]


def json_name(name: str) -> str:
    """A proto field name's JSON name: ``parameters_json_schema`` -> ``parametersJsonSchema``."""
    head, *rest = name.split("_")
    return head + "".join(word[:1].upper() + word[1:] for word in rest)


def _camel(obj: Any, where: str) -> Any:
    if not isinstance(obj, dict):
        return obj
    out: dict[str, Any] = {}
    for key, value in obj.items():
        name = json_name(key) if "_" in key else key
        if name in out:
            raise DialectError(f"'{where}' spells one field twice ({key!r} and {name!r}): send one of them")
        out[name] = value
    return out


def _each(value: Any, fn: Any, where: str) -> Any:
    return [fn(v, f"{where}[{i}]") for i, v in enumerate(value)] if isinstance(value, list) else value


def _content(content: Any, where: str) -> Any:
    content = _camel(content, where)
    if isinstance(content, dict):
        content["parts"] = _each(content.get("parts"), _part, f"{where}.parts")
    return content


def _part(part: Any, where: str) -> Any:
    part = _camel(part, where)
    if isinstance(part, dict):
        for key in ("functionCall", "functionResponse", "inlineData", "fileData"):
            if key in part:
                part[key] = _camel(part[key], f"{where}.{key}")
    return part


def _schema(schema: Any, where: str) -> Any:
    schema = _camel(schema, where)
    if isinstance(schema, dict):
        if isinstance(schema.get("properties"), dict):
            schema["properties"] = {k: _schema(v, f"{where}.properties.{k}") for k, v in schema["properties"].items()}
        if "items" in schema:
            schema["items"] = _schema(schema["items"], f"{where}.items")
        if "anyOf" in schema:
            schema["anyOf"] = _each(schema["anyOf"], _schema, f"{where}.anyOf")
    return schema


def _declaration(declaration: Any, where: str) -> Any:
    declaration = _camel(declaration, where)
    if isinstance(declaration, dict) and "parameters" in declaration:
        declaration["parameters"] = _schema(declaration["parameters"], f"{where}.parameters")
    return declaration


def _tool(tool: Any, where: str) -> Any:
    tool = _camel(tool, where)
    if isinstance(tool, dict) and "functionDeclarations" in tool:
        tool["functionDeclarations"] = _each(tool["functionDeclarations"], _declaration,
                                             f"{where}.functionDeclarations")
    return tool


def normalize(body: Any, where: str = "") -> Any:
    """The request with every message field under its JSON name (see the module docstring)."""
    body = _camel(body, where or "the request")
    if not isinstance(body, dict):
        return body
    at = f"{where}." if where else ""
    if "systemInstruction" in body:
        body["systemInstruction"] = _content(body["systemInstruction"], f"{at}systemInstruction")
    if "contents" in body:
        body["contents"] = _each(body["contents"], _content, f"{at}contents")
    if "tools" in body:
        body["tools"] = _each(body["tools"], _tool, f"{at}tools")
    config = body.get("toolConfig")
    if isinstance(config, dict):
        config = body["toolConfig"] = _camel(config, f"{at}toolConfig")
        if "functionCallingConfig" in config:
            config["functionCallingConfig"] = _camel(config["functionCallingConfig"],
                                                     f"{at}toolConfig.functionCallingConfig")
    generation = body.get("generationConfig")
    if isinstance(generation, dict):
        generation = body["generationConfig"] = _camel(generation, f"{at}generationConfig")
        if "thinkingConfig" in generation:
            generation["thinkingConfig"] = _camel(generation["thinkingConfig"], f"{at}generationConfig.thinkingConfig")
        if "responseSchema" in generation:
            generation["responseSchema"] = _schema(generation["responseSchema"], f"{at}generationConfig.responseSchema")
    if "generateContentRequest" in body:  # countTokens' wrapped request
        body["generateContentRequest"] = normalize(body["generateContentRequest"], f"{at}generateContentRequest")
    return body
