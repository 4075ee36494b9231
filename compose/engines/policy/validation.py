"""vLLM's request validation for ``/v1/chat/completions``: the rules and their exact texts.

Three kinds of refusal, each with vLLM's body ``{"error": {message, type, param, code}}``:

* ``vllm_error``: a ``VLLMValidationError`` (``vllm/exceptions.py``): type
  ``BadRequestError``, the parameter name as ``param``, and the message suffixed
  ``" (parameter=P, value=V)"`` as vLLM's ``__str__`` does;
* ``body_error``: a pydantic field error, as vLLM's RequestValidationError handler
  renders it: type ``Bad Request``, param ``body.<field>``, message
  ``"1 validation error:\\n  {'type': ..., 'loc': 'body.<field>', 'msg': ..., 'input': ...}"``;
* plain ``RequestError``: anything else (a ``ValueError`` in vLLM: ``BadRequestError``, no param).

``field`` coerces like pydantic's lax mode for the types the server reads (an integer
for a float field, a numeric string for a number, "true"/"false" for a bool), so what
vLLM accepts is accepted here. ``check_chat_request`` runs the ``ChatCompletionRequest``
model validators in vLLM's order (``vllm/entrypoints/openai/chat_completion/protocol.py``) for
the server's release: 0.33 refuses ``tools: []``; 0.34 takes it as no tools (``tool_choice``
``auto``/``required`` become ``none``; a named one keeps the list and is refused, naming the tool).
"""

from __future__ import annotations

from typing import Any

from schemas.errors import TokentrailError

JSON_ONLY = "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed"


class RequestError(TokentrailError):
    def __init__(self, message: str, status: int = 400, err_type: str = "BadRequestError",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.err_type, self.param = message, status, err_type, param


def vllm_error(message: str, param: str | None = None, value: Any = None) -> RequestError:
    extras = ([f"parameter={param}"] if param is not None else []) + ([f"value={value}"] if value is not None else [])
    return RequestError(f"{message} ({', '.join(extras)})" if extras else message, param=param)


def _summarised(value: Any) -> Any:
    if isinstance(value, (list, tuple, dict)):
        return f"<{type(value).__name__} of {len(value)} items>"
    return value if isinstance(value, str) else str(value)


def validation_error(kind: str, loc: str, msg: str, value: Any, ctx: dict | None = None) -> RequestError:
    """FastAPI's RequestValidationError as vLLM's handler renders it (one error)."""
    error: dict[str, Any] = {"type": kind, "loc": loc, "msg": msg, "input": _summarised(value)}
    if ctx is not None:
        error["ctx"] = ctx
    return RequestError(f"1 validation error:\n  {error}", err_type="Bad Request", param=loc)


def body_error(name: str, kind: str, msg: str, value: Any) -> RequestError:
    return validation_error(kind, f"body.{name}", msg, value)


_TRUE = ("1", "on", "t", "true", "y", "yes")
_FALSE = ("0", "off", "f", "false", "n", "no")


def coerce(name: str, value: Any, kind: type) -> Any:
    """``value`` as pydantic's lax mode reads it into ``kind``, else vLLM's 400."""
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
            return value.lower() in _TRUE
        if isinstance(value, str):
            raise body_error(name, "bool_parsing", "Input should be a valid boolean, unable to interpret input", value)
        raise body_error(name, "bool_type", "Input should be a valid boolean", value)
    if kind in (int, float):
        if isinstance(value, bool) or isinstance(value, (list, dict)) or value is None:
            label = "integer" if kind is int else "number"
            raise body_error(name, f"{kind.__name__}_type", f"Input should be a valid {label}", value)
        if isinstance(value, str):
            try:
                number = float(value.strip())
            except ValueError:
                label = "integer, unable to parse string as an integer" if kind is int else \
                    "number, unable to parse string as a number"
                raise body_error(name, f"{kind.__name__}_parsing", f"Input should be a valid {label}", value) from None
            value = number
        if kind is int:
            if isinstance(value, float) and not value.is_integer():
                raise body_error(name, "int_from_float",
                                 "Input should be a valid integer, got a number with a fractional part", value)
            return int(value)
        return float(value)
    if kind is str:
        if not isinstance(value, str):
            raise body_error(name, "string_type", "Input should be a valid string", value)
        return value
    if kind is list:
        if not isinstance(value, list):
            raise body_error(name, "list_type", "Input should be a valid list", value)
        return value
    if kind is dict:
        if not isinstance(value, dict):
            raise body_error(name, "dict_type", "Input should be a valid dictionary", value)
        return value
    raise AssertionError(kind)


def field(body: dict, name: str, kind: type, default: Any = None) -> Any:
    """A request field: absent or null is ``default``; otherwise coerced to ``kind``."""
    value = body.get(name)
    return default if value is None else coerce(name, value, kind)


def _int_or_none(data: dict, name: str) -> int | float | None:  # vLLM's validator reads the raw number
    value = data.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise vllm_error(f"`{name}` must be an integer.", name, value)
    return value


def check_chat_request(data: dict, release: str = "0.34") -> dict:
    """``ChatCompletionRequest``'s ``mode="before"`` validators, in vLLM's order: the request as vLLM reads it
    on (a copy where a validator rewrites it, as 0.34's does an empty ``tools``)."""
    if data.get("stream_options") and not data.get("stream"):
        raise vllm_error("Stream options can only be defined when `stream=True`.", "stream_options")
    prompt_logprobs, top_logprobs = _int_or_none(data, "prompt_logprobs"), _int_or_none(data, "top_logprobs")
    if prompt_logprobs is not None:
        if data.get("stream") and (prompt_logprobs > 0 or prompt_logprobs == -1):
            raise vllm_error("`prompt_logprobs` are not available when `stream=True`.", "prompt_logprobs")
        if prompt_logprobs < 0 and prompt_logprobs != -1:
            raise vllm_error("`prompt_logprobs` must be a positive value or -1.", "prompt_logprobs", prompt_logprobs)
    if top_logprobs is not None:
        if top_logprobs < 0 and top_logprobs != -1:
            raise vllm_error("`top_logprobs` must be a positive value or -1.", "top_logprobs", top_logprobs)
        if (top_logprobs == -1 or top_logprobs > 0) and not data.get("logprobs"):
            raise vllm_error("when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs")
    data = _check_tool_usage(data, release)
    if data.get("continue_final_message") and data.get("add_generation_prompt"):
        raise vllm_error("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    return data


def _check_tool_usage(data: dict, release: str) -> dict:
    if data.get("tools") == [] and release == "0.33":
        raise vllm_error("`tools` must not be an empty array. Either provide at least one tool or omit the "
                         "field entirely.", "tools")
    if data.get("tools") == [] and not isinstance(data.get("tool_choice"), dict):
        data = {**data, "tools": None}  # 0.34: OpenAI's reading of an empty list
        if data.get("tool_choice") in ("auto", "required"):
            data["tool_choice"] = "none"
    tools = data.get("tools")
    if tools is not None:
        coerce("tools", tools, list)
        for i, tool in enumerate(tools):
            function = tool.get("function") if isinstance(tool, dict) else None
            if not isinstance(function, dict):
                raise validation_error("missing", f"body.tools.{i}.function", "Field required", tool)
            if not isinstance(function.get("name"), str):
                raise validation_error("missing", f"body.tools.{i}.function.name", "Field required", function)
    choice = data.get("tool_choice")
    if choice is None or choice == "none":
        return data
    if tools is None:
        raise vllm_error("When using `tool_choice`, `tools` must be set.", "tool_choice")
    if choice not in ("auto", "required") and not isinstance(choice, dict):
        raise vllm_error(f"Invalid value for `tool_choice`: {choice}! Only named tools, \"none\", \"auto\" or "
                         "\"required\" are supported.", "tool_choice")
    if isinstance(choice, dict):
        usage = 'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`'
        function = choice.get("function")
        if not isinstance(function, dict):
            raise vllm_error(f"Invalid value for `function`: `{function}` in `tool_choice`! {usage}",
                             "tool_choice.function")
        if "name" not in function:
            raise vllm_error(f"Expected field `name` in `function` in `tool_choice`! {usage}",
                             "tool_choice.function.name")
        name = function["name"]
        if not isinstance(name, str) or not name:
            raise vllm_error(f"Invalid `name` in `function`: `{name}` in `tool_choice`! {usage}",
                             "tool_choice.function.name")
        if not any(t["function"]["name"] == name for t in tools):
            named = "" if release == "0.33" else f" `{name}`"
            raise vllm_error(f"The tool{named} specified in `tool_choice` does not match any of the specified "
                             "`tools`", "tool_choice")
    return data


def check_messages(messages: Any) -> list:
    """``messages`` is a list of objects with a string role (vLLM's union of message params)."""
    messages = coerce("messages", messages, list)
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise validation_error("model_attributes_type", f"body.messages.{i}",
                                   "Input should be a valid dictionary or object to extract fields from", message)
        if not isinstance(message.get("role"), str):
            raise validation_error("missing", f"body.messages.{i}.role", "Field required", message)
    return messages


def check_prompt_ids(ids: Any, vocab_size: int) -> list[int]:
    """``kv_transfer_params.prompt_token_ids`` (``vllm/renderers/online_renderer.py``)."""
    param = "kv_transfer_params.prompt_token_ids"
    if not isinstance(ids, list) or not ids or any(type(x) is not int or x < 0 for x in ids):
        raise vllm_error("`kv_transfer_params['prompt_token_ids']` must be a non-empty list of non-negative "
                         "integers.", param)
    if max(ids) >= vocab_size:
        raise vllm_error(f"Token id {max(ids)} is out of vocabulary", param)
    return list(ids)


def has_non_text_content(messages: list) -> bool:
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and any(isinstance(p, dict) and p.get("type", "text") != "text" for p in content):
            return True
    return False
