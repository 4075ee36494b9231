"""The capture side: the interceptor (proxy or vLLM middleware), its dialects, the finish API.

Rooms: ``http/`` (the ASGI edge: app, admission, routes, control), ``call/`` (one generating call:
the handler, the engine leg, streaming), ``engine/`` (what the engine serves and answers),
``capture/`` (the evidence: events, lineage, versions, durability), ``dialects/`` (translators and
their adapters). At the top: the process (``settings``, ``services``, ``metrics``, ``logs``), its
entry points (``cli``, ``middleware``, ``finish_cli``, ``token_cli``) and the finish API (``finish``).

Public surface (resolved lazily, so importing the package pulls in no framework):
``Interceptor`` and ``InterceptorSettings`` (the proxy), ``TokentrailMiddleware`` (in-engine),
``finish_rollout`` and ``finished_event_body`` (finish a rollout; no web framework), and the
dialect registry ``DIALECTS`` / ``DialectRegistry`` / ``DialectSpec``.
"""

from schemas.surface import lazy_surface

__all__, __getattr__ = lazy_surface(__name__, {
    "Interceptor": "producers.http.app",
    "InterceptorSettings": "producers.settings",
    "TokentrailMiddleware": "producers.middleware",
    "finish_rollout": "producers.finish",
    "finished_event_body": "producers.finish",
    "DIALECTS": "producers.dialects.registry",
    "DialectRegistry": "producers.dialects.registry",
    "DialectSpec": "producers.dialects.registry",
})
