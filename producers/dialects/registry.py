"""The dialect registry: the one table routing, response ids and the interceptor read (pure).

A dialect is one ``DialectSpec``: its name (logs, errors, tests), the generating API path it
serves under the capture prefix, its ``CallFacts.dialect`` wire symbol, the prefix of the
response ids it hands out, the ``"module:Class"`` of its adapter, and whether its streams ask
the engine for usage. Adding a dialect is its module(s) plus one ``DialectSpec`` line in
``DIALECTS`` (or, for a test or a plug-in, ``DialectRegistry([*DIALECTS, spec])``).

Guarantees:

* Pure: the stdlib and ``schemas`` only. Adapter modules (which use starlette) are imported
  only by ``load_adapters``, never when this module is imported.
* ``register`` refuses (``ConfigError``) a spec whose name, path or response-id prefix another
  spec already has, or whose prefix ``call_id_from_response_id`` could not read back; so a
  response id names exactly one dialect and a path routes to exactly one adapter.
* ``load_adapters`` fails at startup (``ConfigError`` naming the target) when an adapter cannot
  be imported or lacks a method of the adapter protocol, never at a harness's first call.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from schemas.errors import ConfigError, ContractError
from schemas.ids import check_response_id_prefix
from schemas.ids import response_id as _response_id
from schemas.plugins import load_class
from schemas.records import Dialect

__all__ = ["ADAPTER_METHODS", "DIALECTS", "DialectRegistry", "DialectSpec"]

# The methods of producers.dialects.base.DialectAdapter (kept here so loading needs no framework;
# a unit test checks the two agree).
ADAPTER_METHODS = ("parse", "render", "stream_adapter", "error", "upstream_error")


@dataclass(frozen=True, slots=True)
class DialectSpec:
    """One dialect, declared once."""

    name: str  # the one name: "chat", "anthropic", "responses" (logs, errors, tests)
    path: str  # its generating API path, e.g. "/v1/chat/completions"
    wire: Dialect  # the CallFacts.dialect symbol
    response_id_prefix: str  # response id = prefix + "tt" + model_call_id
    adapter: str  # "module:Class" of its DialectAdapter, built as Class(spec) at startup
    stream_usage: bool  # ask the engine for stream_options.include_usage when streaming

    def response_id(self, model_call_id: str) -> str:
        """The response id the harness sees for a call of this dialect; it names the call."""
        return _response_id(self.response_id_prefix, model_call_id)


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
        if not spec.path.startswith("/") or spec.path != spec.path.rstrip("/"):
            raise ConfigError(f"dialect {spec.name!r}: path {spec.path!r} must start with '/' and not end with one")
        try:
            check_response_id_prefix(spec.response_id_prefix)
        except ContractError as exc:
            raise ConfigError(f"dialect {spec.name!r}: {exc}") from None
        for other in self._specs.values():
            for what in ("name", "path", "response_id_prefix"):
                if getattr(other, what) == getattr(spec, what):
                    raise ConfigError(f"dialect {spec.name!r}: {what} {getattr(spec, what)!r} is already "
                                      f"registered by dialect {other.name!r}")
        self._specs[spec.name] = spec
        return spec

    def get(self, name: str) -> DialectSpec | None:
        return self._specs.get(name)

    def for_path(self, api_path: str) -> DialectSpec | None:
        """The dialect generating at exactly ``api_path`` (a trailing ``/`` ignored), or None."""
        stripped = api_path.rstrip("/")
        return next((spec for spec in self._specs.values() if spec.path == stripped), None)

    def for_suffix(self, path: str) -> DialectSpec | None:
        """The dialect whose path ``path`` ends with (for errors before a route is parsed); the longest wins."""
        stripped = path.rstrip("/")
        matches = [spec for spec in self._specs.values() if stripped.endswith(spec.path)]
        return max(matches, key=lambda spec: len(spec.path), default=None)

    def __iter__(self) -> Iterator[DialectSpec]:
        return iter(list(self._specs.values()))

    def __len__(self) -> int:
        return len(self._specs)

    def load_adapters(self) -> dict[str, Any]:
        """name -> adapter instance (``Class(spec)``); ConfigError naming the target that cannot be loaded."""
        return {spec.name: _load(spec) for spec in self._specs.values()}


def _load(spec: DialectSpec) -> Any:
    adapter = load_class(spec.adapter, f"adapter of dialect {spec.name!r}")(spec)
    missing = [name for name in ADAPTER_METHODS if not callable(getattr(adapter, name, None))]
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
])
