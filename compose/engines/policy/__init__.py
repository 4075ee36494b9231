"""The vLLM-compatible reference policy server (stands in for vLLM 0.34, or 0.33, without a GPU).

Public API: ``create_app(settings) -> Starlette`` and ``PolicySettings``; the pieces
(``Tokenizer``, the chat template, ``PolicyModel``) are importable from their modules.
Importing this package does not import Starlette; ``create_app`` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from compose.engines.policy.settings import PolicySettings

if TYPE_CHECKING:
    from starlette.applications import Starlette

__all__ = ["PolicySettings", "create_app"]


def create_app(settings: PolicySettings | None = None, **overrides: Any) -> Starlette:
    """Build the ASGI app (``settings`` or keyword overrides, validated either way)."""
    from compose.engines.policy.server import create_app as _create_app

    if overrides:
        base = settings.model_dump() if settings is not None else {}
        settings = PolicySettings(**{**base, **overrides})
    return _create_app(settings)
