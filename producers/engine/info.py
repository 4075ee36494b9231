"""What the engine serves and what it can take: asked once (GET /v1/models), plus its side routes.

vLLM answers 404 for a model name it does not serve, and Claude Code or Codex send
their own names (``claude-...``). It refuses ``max_tokens`` above ``max_model_len``, and
Claude Code asks for 32000 or 128000. So the interceptor asks the engine once what it
serves (``data[].id``, ``data[].max_model_len``), caches the answer, and retries the
question on the next call while it has none.

Guarantees:

* ``EngineInfo.choose`` never invents a name: a forced name (``upstream_model``) wins,
  then the harness's name when the engine serves it, then the first served one.
* ``context_refusal`` reads vLLM's own 400 texts (``vllm/renderers/params.py``,
  ``vllm/entrypoints/serve/utils/api_utils.py``, and the older "(N in the messages, M in
  the completion)" form the reference server keeps). It reports what the text says and
  returns None for any other message; it never guesses a prompt length.
* The HTTP helpers raise ``EngineCallError`` (naming the route, the status and the
  engine's message) for every failure, whatever the transport raised.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from schemas.errors import ConfigError, TokentrailError

log = logging.getLogger("tokentrail.interceptor")

MODELS_PATH = "/v1/models"
TOKENIZE_PATH = "/tokenize"
RENDER_PATH = "/v1/chat/completions/render"
CHAT_PATH = "/v1/chat/completions"


class EngineCallError(TokentrailError):
    """A side call to the engine (models, render, tokenize) failed; the message says how."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status  # the engine's HTTP status, None when it never answered


@dataclass(frozen=True, slots=True)
class ServedModel:
    id: str
    max_model_len: int | None = None


@dataclass(frozen=True, slots=True)
class EngineInfo:
    models: tuple[ServedModel, ...]

    @property
    def names(self) -> list[str]:
        return [m.id for m in self.models]

    def choose(self, requested: Any, forced: str | None) -> tuple[Any, str]:
        """(the model name to send, why: forced / served / substituted)."""
        if forced:
            return forced, "forced"
        names = self.names
        if requested in names or not names:
            return requested, "served"
        return names[0], "substituted"

    def max_model_len(self, model: Any) -> int | None:
        for m in self.models:
            if m.id == model:
                return m.max_model_len
        # A forced name the list does not show (a LoRA alias, a router): one shared length still holds.
        lengths = {m.max_model_len for m in self.models}
        return lengths.pop() if len(lengths) == 1 else None


def parse_models(data: Any) -> EngineInfo:
    """The ``GET /v1/models`` answer; ValueError naming the field when it is not vLLM's shape."""
    entries = data.get("data") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"GET {MODELS_PATH}: 'data' must be a non-empty list of models, got {str(data)[:200]!r}")
    models = []
    for i, entry in enumerate(entries):
        name = entry.get("id") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name:
            raise ValueError(f"GET {MODELS_PATH}: data[{i}].id must be a non-empty string, got {entry!r}")
        length = entry.get("max_model_len")
        models.append(ServedModel(name, length if isinstance(length, int) and length > 0 else None))
    return EngineInfo(tuple(models))


class EngineCatalog:
    """The engine's model list, fetched once on demand; a failed fetch is retried by the next call.

    Concurrent first calls share one fetch. ``get`` never raises: without an answer the
    call goes ahead unchanged (the engine then says what is wrong, and that is recorded).
    A server without the route (404/405) is remembered as listing no models.
    """

    def __init__(self) -> None:
        self.info: EngineInfo | None = None
        # Learned once at startup (``generate_probe``), never per call: the engine streams derendered
        # generations from supplied ids (vLLM >= 0.34), so prefix supply of streamed calls takes that route.
        self.streams_derender = False
        self._attempt: asyncio.Future[EngineInfo | None] | None = None
        self._logged: set[tuple[Any, Any]] = set()

    async def get(self, client: httpx.AsyncClient, headers: Mapping[str, str | bytes]) -> EngineInfo | None:
        if self.info is not None:
            return self.info
        if self._attempt is None:
            self._attempt = asyncio.ensure_future(self._discover(client, headers))
        return await asyncio.shield(self._attempt)

    async def _discover(self, client: httpx.AsyncClient, headers: Mapping[str, str | bytes]) -> EngineInfo | None:
        try:
            self.info = parse_models(await get_json(client, MODELS_PATH, headers))
            log.info("engine serves %s", ", ".join(f"{m.id} (max_model_len {m.max_model_len})"
                                                   for m in self.info.models))
        except EngineCallError as exc:
            if exc.status in (404, 405):
                # A definite answer: this server lists no models. Asking again on every call would
                # only add a round trip; names and budgets then go to it as asked.
                self.info = EngineInfo(())
                log.warning("the engine has no GET %s (%s): model names and max_tokens are sent as asked",
                            MODELS_PATH, exc)
            else:
                log.warning("could not learn what the engine serves (retried on the next call): %s", exc)
        except ValueError as exc:
            log.warning("could not learn what the engine serves (retried on the next call): %s", exc)
        finally:
            self._attempt = None
        return self.info

    def note_substitution(self, requested: Any, sent: Any) -> None:
        """Log once per name pair that the harness's model name was replaced."""
        if (requested, sent) not in self._logged and len(self._logged) < 1024:
            self._logged.add((requested, sent))
            names = ", ".join(self.info.names) if self.info else "?"
            log.warning("the engine does not serve model %r (it serves %s): sending %r; set upstream_model "
                        "(--upstream-model) to choose", requested, names, sent)


# -- context-window refusals ------------------------------------------------------------------

_OVER_LIMIT = re.compile(r"\b(?:max_tokens|max_completion_tokens)=(\d+) cannot be greater than "
                         r"max_model_len=(\d+)")
_CONTEXT = re.compile(r"maximum context length is (\d+) tokens")
_IN_MESSAGES = re.compile(r"\((\d+) in the messages")
_PROMPT_HAS = re.compile(r"your prompt contains (?:at least )?(\d+) input tokens")
_INPUT_LENGTH = re.compile(r"Input length \((\d+)\) exceeds model's maximum context length \((\d+)\)")


@dataclass(frozen=True, slots=True)
class ContextRefusal:
    """What an engine's 400 says about its context window."""

    max_model_len: int | None
    input_tokens: int | None  # None: the text does not say (ask /tokenize)
    over_limit: bool = False  # max_tokens alone exceeded max_model_len; the prompt was not measured


def context_refusal(message: str) -> ContextRefusal | None:
    """The refusal in ``message``, or None when the engine refused for another reason."""
    if m := _OVER_LIMIT.search(message):
        return ContextRefusal(int(m[2]), None, over_limit=True)
    if m := _INPUT_LENGTH.search(message):
        return ContextRefusal(int(m[2]), int(m[1]))
    if m := _CONTEXT.search(message):
        used = _IN_MESSAGES.search(message) or _PROMPT_HAS.search(message)
        return ContextRefusal(int(m[1]), int(used[1]) if used else None)
    return None


def max_tokens_key(body: dict[str, Any]) -> str:
    """The field vLLM reads the output budget from (max_completion_tokens wins, as in vLLM)."""
    return "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"


def engine_message(content: bytes) -> str:
    """The ``error.message`` of an engine error body, else its first 500 bytes as text."""
    try:
        data = orjson.loads(content)
    except ValueError:
        return content[:500].decode(errors="replace")
    error = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(error, dict):
        return str(error.get("message") or error.get("detail") or error)
    return str(error)


# -- side calls ------------------------------------------------------------------------------

async def get_json(client: httpx.AsyncClient, path: str, headers: Mapping[str, str | bytes]) -> Any:
    return await _call(client, "GET", path, headers, None)


async def post_json(client: httpx.AsyncClient, path: str, headers: Mapping[str, str | bytes],
                    body: dict[str, Any]) -> Any:
    return await _call(client, "POST", path, headers, body)


async def _call(client: httpx.AsyncClient, method: str, path: str, headers: Mapping[str, str | bytes],
                body: dict[str, Any] | None) -> Any:
    headers = {**headers, "content-type": "application/json"}
    content = None if body is None else orjson.dumps(body)
    try:
        # httpx takes str and bytes header values mixed (each is normalized); its type hint says one or the other.
        request = client.build_request(method, path, headers=headers, content=content)  # type: ignore[arg-type]
        response = await client.send(request, stream=True)
    except Exception as exc:  # in-process upstreams raise anything (KeyError, ...), not only httpx errors
        raise EngineCallError(f"{method} {path}: engine unreachable ({exc!r})") from exc
    try:
        kind = response.headers.get("content-type", "")
        if not kind.startswith("application/json"):
            # Checked before reading: a body that is not JSON (an SSE stream, HTML) may never end.
            raise EngineCallError(f"{method} {path}: HTTP {response.status_code} with content-type {kind!r}, "
                                  "not JSON", response.status_code)
        data = await response.aread()
    except EngineCallError:
        raise
    except Exception as exc:
        raise EngineCallError(f"{method} {path}: reading the answer failed ({exc!r})") from exc
    finally:
        await response.aclose()
    if response.status_code >= 400:
        raise EngineCallError(f"{method} {path}: HTTP {response.status_code}: {engine_message(data)}",
                              response.status_code)
    try:
        return orjson.loads(data)
    except ValueError as exc:
        raise EngineCallError(f"{method} {path}: invalid JSON ({exc})", response.status_code) from exc


async def prompt_tokens(client: httpx.AsyncClient, headers: Mapping[str, str | bytes],
                        chat_body: dict[str, Any]) -> int:
    """How many tokens the engine renders ``chat_body``'s messages to (vLLM's POST /tokenize)."""
    body = {k: chat_body[k] for k in ("model", "messages", "tools", "chat_template_kwargs", "add_generation_prompt",
                                      "continue_final_message") if chat_body.get(k) is not None}
    data = await post_json(client, TOKENIZE_PATH, headers, body)
    count = data.get("count") if isinstance(data, dict) else None
    if not isinstance(count, int):
        raise EngineCallError(f"POST {TOKENIZE_PATH}: no integer 'count' in {str(data)[:200]!r}")
    return count


async def render_ids(client: httpx.AsyncClient, headers: Mapping[str, str | bytes],
                     chat_body: dict[str, Any]) -> list[int]:
    """The prompt ids the engine renders ``chat_body`` to (vLLM's POST /v1/chat/completions/render)."""
    data = await post_json(client, RENDER_PATH, headers, chat_body)
    ids = data.get("token_ids") if isinstance(data, dict) else None
    if not isinstance(ids, list) or not ids or not all(type(t) is int and t >= 0 for t in ids):
        raise EngineCallError(f"POST {RENDER_PATH}: no 'token_ids' list in {str(data)[:200]!r}")
    return ids


# Two different conversations: an engine that ignored the supplied ids would render the second.
_PROBE_RENDERED = [{"role": "user", "content": "tokentrail prefix-supply probe: answer A"}]
_PROBE_SENT = [{"role": "user", "content": "tokentrail prefix-supply probe: answer B, not A"}]
_PROBE_FIX = ("serve with vLLM >= 0.32 (it has POST /v1/chat/completions/render and honours "
              "kv_transfer_params.prompt_token_ids) or turn prefix supply off (drop --prefix-supply, "
              "TOKENTRAIL_PREFIX_SUPPLY=0)")


async def probe_prefix_supply(client: httpx.AsyncClient, headers: Mapping[str, str | bytes], model: str | None) -> None:
    """ConfigError unless the engine renders chat requests and generates from supplied prompt ids.

    One render and one ``max_tokens=1`` generation: the generation's ``prompt_token_ids`` must
    be the rendered ids, although its messages say something else.
    """
    base: dict[str, Any] = {"model": model} if model else {}
    try:
        ids = await render_ids(client, headers, {**base, "messages": _PROBE_RENDERED})
    except EngineCallError as exc:
        raise ConfigError(f"--prefix-supply needs the engine to render chat requests, and it could not: {exc}; "
                          f"{_PROBE_FIX}") from exc
    body = {**base, "messages": _PROBE_SENT, "max_tokens": 1, "stream": False, "return_token_ids": True,
            "kv_transfer_params": {"prompt_token_ids": ids}}
    try:
        data = await post_json(client, CHAT_PATH, headers, body)
    except EngineCallError as exc:
        raise ConfigError(f"--prefix-supply: the engine refused a generation from supplied prompt ids: {exc}; "
                          f"{_PROBE_FIX}") from exc
    got = data.get("prompt_token_ids") if isinstance(data, dict) else None
    if got != ids:
        seen = f"{len(got)} other ids" if isinstance(got, list) else "no prompt_token_ids"
        raise ConfigError(f"--prefix-supply: the engine does not honour kv_transfer_params.prompt_token_ids "
                          f"(supplied {len(ids)} ids, it reported {seen}); {_PROBE_FIX}")
