"""The dialect registry: the one table routing, response ids and the interceptor read (pure).

A dialect is one ``DialectSpec``: its name (logs, errors, tests), the generating API path it
serves under the capture prefix, its ``CallFacts.dialect`` wire symbol, the prefix of the
response ids it hands out, the ``"module:Class"`` of its adapter, and whether its streams ask
the engine for usage. Adding a dialect is its module(s) plus one ``DialectSpec`` line in
``DIALECTS`` (or, for a test or a plug-in, ``DialectRegistry([*DIALECTS, spec])``).

A path is exact (``/v1/messages``) or a pattern whose ``{model}`` names the model in the path
and whose ``{version}`` is an API version segment (Gemini's ``/{version}/models/{model}:generateContent``
serves ``v1beta``, what the Gemini CLI calls, and ``v1``, google-genai's default). A dialect whose API says "stream"
in the path rather than the body names that path too (``stream_path``), and one whose token
counting the interceptor answers itself names its ``count_path``. Which dialect a path belongs
to, and what its path says (``PathMatch``: the model, streaming or not, counting or not), is
decided here and only here: route policy, the interceptor and the vLLM middleware ask
``match`` / ``for_path``.

Guarantees:

* Pure: the stdlib and ``schemas`` only. Adapter modules (which use starlette) are imported
  only by ``load_adapters``, never when this module is imported.
* ``register`` refuses (``ConfigError``) a spec whose name, path or response-id prefix another
  spec already has, or whose prefix ``call_id_from_response_id`` could not read back; so a
  response id names exactly one dialect and a path routes to exactly one adapter.
* A ``{model}`` matches one path segment part of ``MODEL_RULE`` only (letters, digits, ``.``, ``_``,
  ``-``, starting with a letter or digit: never ``.`` or ``..``): a model with a separator, raw or
  encoded (``%2F``, ``%3A``, ``%5C``, which arrive decoded), or any other character matches no
  dialect, so the route table refuses it (404). ``{version}`` matches ``VERSION_RULE`` only.
* ``load_adapters`` fails at startup (``ConfigError`` naming the target) when an adapter cannot
  be imported or lacks a method of the adapter protocol (and, with a ``count_path``, of
  ``COUNT_METHODS``), never at a harness's first call.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from schemas.errors import ConfigError, ContractError
from schemas.ids import check_response_id_prefix
from schemas.ids import response_id as _response_id
from schemas.plugins import load_class
from schemas.records import Dialect

__all__ = ["ADAPTER_METHODS", "COUNT_METHODS", "DIALECTS", "MODEL_RULE", "VERSION_RULE", "DialectRegistry",
           "DialectSpec", "PathMatch"]

# The methods of producers.dialects.base.DialectAdapter (kept here so loading needs no framework;
# a unit test checks the two agree).
ADAPTER_METHODS = ("parse", "render", "stream_adapter", "error", "upstream_error")
# What the adapter of a dialect with a count_path has besides (producers.call.count calls them).
COUNT_METHODS = ("count_request", "count_response")
# What a {model} in a path pattern matches: one segment part, no separator, no ':' (Gemini's method follows it).
MODEL_RULE = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
# What a {version} matches: an API version segment (Gemini's v1 and v1beta; v1alpha).
VERSION_RULE = r"v[0-9]+(?:alpha|beta)?[0-9]*"
_PLACEHOLDER = re.compile(r"\{(model|version)\}")
_RULES = {"model": f"(?P<model>{MODEL_RULE})", "version": f"(?:{VERSION_RULE})"}


@dataclass(frozen=True, slots=True)
class DialectSpec:
    """One dialect, declared once."""

    name: str  # the one name: "chat", "anthropic", "responses", "google" (logs, errors, tests)
    path: str  # its generating API path, e.g. "/v1/chat/completions", or a {model} pattern
    wire: Dialect  # the CallFacts.dialect symbol
    response_id_prefix: str  # response id = prefix + "tt" + model_call_id
    adapter: str  # "module:Class" of its DialectAdapter, built as Class(spec) at startup
    stream_usage: bool  # ask the engine for stream_options.include_usage when streaming
    stream_path: str = ""  # a generating path whose calls always stream (the API says so in the path)
    count_path: str = ""  # a token-counting path the adapter answers (``count_request``), never captured

    def response_id(self, model_call_id: str) -> str:
        """The response id the harness sees for a call of this dialect; it names the call."""
        return _response_id(self.response_id_prefix, model_call_id)

    def paths(self) -> tuple[str, ...]:
        """Every path (or pattern) this dialect serves: generating, streaming, counting."""
        return tuple(p for p in (self.path, self.stream_path, self.count_path) if p)

    def match(self, api_path: str) -> PathMatch | None:
        """What ``api_path`` (a trailing ``/`` ignored) says for this dialect, or None when it is none of its paths."""
        stripped = api_path.rstrip("/")
        for path, stream, count in ((self.path, False, False), (self.stream_path, True, False),
                                    (self.count_path, False, True)):
            if not path:
                continue
            if not _is_pattern(path):
                if stripped == path:
                    return PathMatch(self, None, stream, count)
                continue
            found = _pattern(path, suffix=False).fullmatch(stripped)
            if found is not None:
                return PathMatch(self, found.groupdict().get("model"), stream, count)
        return None


@dataclass(frozen=True, slots=True)
class PathMatch:
    """A path of a dialect: the model it names (patterns only), whether its calls stream, whether it counts."""

    spec: DialectSpec
    model: str | None
    stream: bool
    count: bool


def _is_pattern(path: str) -> bool:
    return "{" in path


def _pattern(path: str, *, suffix: bool) -> re.Pattern[str]:
    """The regex of a path pattern; ``suffix``: any path ending like it, any text in a placeholder (the error
    shape of a refused ``.../models/org/x:generateContent`` is still Google's)."""
    pieces = _PLACEHOLDER.split(path)  # literal, name, literal, name, ..., literal
    regex = "".join(("(?:.+)" if suffix else _RULES[piece]) if n % 2 else re.escape(piece)
                    for n, piece in enumerate(pieces))
    return re.compile(("(?:.*)" if suffix else "") + regex)


class DialectRegistry:
    """Dialects by name, path and prefix; iterates in registration order."""

    def __init__(self, specs: Iterable[DialectSpec] = ()) -> None:
        self._specs: dict[str, DialectSpec] = {}
        for spec in specs:
            self.register(spec)

    def register(self, spec: DialectSpec) -> DialectSpec:
        """Add ``spec``; ConfigError when it clashes with a registered one or is malformed."""
        if not isinstance(spec.wire, Dialect):
            raise ConfigError(f"dialect {spec.name!r}: wire must be a schemas.records.Dialect, got {spec.wire!r}")
        for path in spec.paths():
            if not path.startswith("/") or path != path.rstrip("/"):
                raise ConfigError(f"dialect {spec.name!r}: path {path!r} must start with '/' and not end with one")
            names = _PLACEHOLDER.findall(path)
            rest = _PLACEHOLDER.sub("", path)
            if len(names) != len(set(names)) or "{" in rest or "}" in rest:
                raise ConfigError(f"dialect {spec.name!r}: path {path!r} may hold {{model}} and {{version}} once "
                                  "each, and no other braces")
        try:
            check_response_id_prefix(spec.response_id_prefix)
        except ContractError as exc:
            raise ConfigError(f"dialect {spec.name!r}: {exc}") from None
        for other in self._specs.values():
            for what in ("name", "response_id_prefix"):
                if getattr(other, what) == getattr(spec, what):
                    raise ConfigError(f"dialect {spec.name!r}: {what} {getattr(spec, what)!r} is already "
                                      f"registered by dialect {other.name!r}")
            for path in set(spec.paths()) & set(other.paths()):
                raise ConfigError(f"dialect {spec.name!r}: path {path!r} is already registered by dialect "
                                  f"{other.name!r}")
        self._specs[spec.name] = spec
        return spec

    def get(self, name: str) -> DialectSpec | None:
        return self._specs.get(name)

    def match(self, api_path: str) -> PathMatch | None:
        """What ``api_path`` is for the dialect it belongs to (generating, streaming or counting), or None.

        The first registered dialect whose path matches wins; no two register the same path."""
        return next((m for spec in self._specs.values() if (m := spec.match(api_path)) is not None), None)

    def for_path(self, api_path: str) -> DialectSpec | None:
        """The dialect generating at ``api_path`` (its path or stream path; a trailing ``/`` ignored), or None."""
        found = self.match(api_path)
        return found.spec if found is not None and not found.count else None

    def for_suffix(self, path: str) -> DialectSpec | None:
        """The dialect one of whose paths ``path`` ends with (for errors before a route is parsed); the longest
        wins."""
        stripped = path.rstrip("/")
        best: tuple[int, DialectSpec] | None = None
        for spec in self._specs.values():
            for pattern in spec.paths():
                found = (stripped.endswith(pattern) if not _is_pattern(pattern)
                         else _pattern(pattern, suffix=True).fullmatch(stripped) is not None)
                if found and (best is None or len(pattern) > best[0]):
                    best = (len(pattern), spec)
        return best[1] if best is not None else None

    def __iter__(self) -> Iterator[DialectSpec]:
        return iter(list(self._specs.values()))

    def __len__(self) -> int:
        return len(self._specs)

    def load_adapters(self) -> dict[str, Any]:
        """name -> adapter instance (``Class(spec)``); ConfigError naming the target that cannot be loaded."""
        return {spec.name: _load(spec) for spec in self._specs.values()}


def _load(spec: DialectSpec) -> Any:
    adapter = load_class(spec.adapter, f"adapter of dialect {spec.name!r}")(spec)
    methods = ADAPTER_METHODS + (COUNT_METHODS if spec.count_path else ())
    missing = [name for name in methods if not callable(getattr(adapter, name, None))]
    if missing:
        raise ConfigError(f"dialect {spec.name!r}: adapter {spec.adapter!r} lacks {', '.join(missing)} "
                          "(producers.dialects.base.DialectAdapter)")
    return adapter


DIALECTS = DialectRegistry([
    DialectSpec("chat", "/v1/chat/completions", Dialect.CHAT_COMPLETIONS, "chatcmpl-",
                "producers.dialects.chat:ChatAdapter", stream_usage=False),
    DialectSpec("anthropic", "/v1/messages", Dialect.ANTHROPIC_MESSAGES, "msg_",
                "producers.dialects.anthropic_adapter:AnthropicAdapter", stream_usage=True),
    DialectSpec("responses", "/v1/responses", Dialect.RESPONSES, "resp_",
                "producers.dialects.responses_adapter:ResponsesAdapter", stream_usage=True),
    DialectSpec("google", "/{version}/models/{model}:generateContent", Dialect.GOOGLE_GENERATE_CONTENT, "gen_",
                "producers.dialects.google_adapter:GoogleAdapter", stream_usage=True,
                stream_path="/{version}/models/{model}:streamGenerateContent",
                count_path="/{version}/models/{model}:countTokens"),
])
