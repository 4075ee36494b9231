"""The interceptor as ASGI middleware inside vLLM's own server: ``vllm serve ... --middleware producers.middleware.TokentrailMiddleware``.

Same capture core as the standalone proxy; the "upstream" is the wrapped app
itself, called in-process through a streaming ASGI transport (httpx's own
ASGITransport buffers whole responses, which would break true streaming).
Paths under ``/ng-rollout/``, the control routes and ``/tokentrail/metrics`` go
to the interceptor; everything else goes straight to the wrapped app. Under
``/ng-rollout/`` the interceptor's route table (``producers.http.route_policy``) holds
exactly as in the proxy: vLLM's admin routes (LoRA, sleep/wake, cache resets,
``collective_rpc``, pause/resume, weight versions) reached through the prefix are
refused, never handed to vLLM; the rollout token and the body-size limit apply too.
vLLM's own bare routes are vLLM's to protect (its ``--api-key``), as without tokentrail.

vLLM registers a middleware class with ``app.add_middleware(cls)``, so the app
this middleware wraps is the *inner middleware chain*, not the FastAPI app: the
in-process request gets the outer scope's ``app``, ``state``, ``root_path`` and
``extensions`` (vLLM's handlers read ``request.app.state``), and anything the
engine raises becomes an httpx transport error, recorded as upstream_error.

Settings come from the environment (vLLM builds the middleware with the app
only), one line per variable in ``ENV_SETTINGS``. A missing or invalid value is
logged once, and every interceptor route then answers 503 naming the variable,
while vLLM's own routes keep working: under uvicorn's default ``lifespan="auto"``
an exception while the middleware stack is built is taken for "lifespan
unsupported", after which every request of the server, vLLM's included, fails.

Several API server processes (vLLM starts one per data-parallel rank): each
builds its own middleware, with its own lineage index, and claims its own spool
under ``TOKENTRAIL_SPOOL_DIR``: the first ``api-<k>`` directory no live process
holds (the spool's flock), preferring one that still holds events, so a
restarted process drains what a dead one left, in order and exactly once. When
fewer processes run than before, a directory left with events waits for the
next process that claims it (its events are never lost, only late).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
from pathlib import Path
from typing import Any

import httpx
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from producers.dialects.base import DialectAdapter
from producers.dialects.registry import DIALECTS
from producers.http.app import Interceptor
from producers.http.inprocess import StreamingASGITransport
from producers.http.replies import error_response
from producers.http.routing import parse_route
from producers.middleware_env import IN_PROCESS, claim_spool_dir, settings_from_env
from producers.settings import InterceptorSettings
from schemas.errors import ConfigError, ContractError, DurabilityError

__all__ = ["TokentrailMiddleware"]

log = logging.getLogger("tokentrail.interceptor")

_OURS = ("/ng-rollout/", "/rollouts/", "/tokentrail/admin/")
_METRICS = "/tokentrail/metrics"


# -- the middleware --------------------------------------------------------------------------

# The outer (harness) request being served, for the in-process call made on its behalf.
_OUTER_SCOPE: contextvars.ContextVar[Scope | None] = contextvars.ContextVar("tokentrail_outer_scope", default=None)


class TokentrailMiddleware:
    def __init__(self, app: ASGIApp, settings: InterceptorSettings | None = None, **overrides: Any) -> None:
        self.app = app
        self.config_error: str | None = None
        self.interceptor: Interceptor | None = None
        self._outer: dict[str, Any] = {}  # app / state / root_path / extensions last seen from the server
        self._started: asyncio.Lock | None = None
        self._ready = False
        self._logged: set[str] = set()
        if settings is None:
            try:
                settings = settings_from_env()
            except ConfigError as exc:  # report once; vLLM keeps serving, our routes answer 503 (module docstring)
                self.config_error = str(exc)
                log.error("tokentrail capture is OFF in this vLLM process: %s; every /ng-rollout/ call answers 503 "
                          "until the server is restarted with it fixed", exc)
                return
        self._spool_parent = settings.spool_dir
        self.interceptor = Interceptor(
            settings,
            upstream=httpx.AsyncClient(transport=StreamingASGITransport(app, self._outer_values), base_url=IN_PROCESS,
                                       timeout=httpx.Timeout(settings.engine_timeout_s)),
            **overrides,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind in ("http", "lifespan"):
            self._remember(scope)
        if kind == "http":
            path = _route_path(scope)
            if path.startswith(_OURS) or path == _METRICS:
                token = _OUTER_SCOPE.set(scope)
                try:
                    await self._serve_ours(scope, path, receive, send)
                finally:
                    _OUTER_SCOPE.reset(token)
                return
        if kind == "lifespan":
            await self.app(scope, receive, self._on_lifespan_send(send))
            return
        await self.app(scope, receive, send)

    async def _serve_ours(self, scope: Scope, path: str, receive: Receive, send: Send) -> None:
        if self.interceptor is None:
            response = _unavailable(path, f"tokentrail capture is not configured in this vLLM process: "
                                          f"{self.config_error}")
            await response(scope, receive, send)
            return
        try:
            await self._ensure_started()
        except Exception as exc:
            self._log_once(f"tokentrail capture could not start (retried on the next call): {exc!r}")
            await _unavailable(path, f"tokentrail capture could not start: {exc}")(scope, receive, send)
            return
        inner = {**scope, "path": "/metrics" if path == _METRICS else path, "root_path": ""}
        # The raw path, percent-encoding kept, is what rollout ids are checked against (a%2Fb is
        # not a/b); only the server's root_path comes off, as it does from the decoded path.
        inner["raw_path"] = b"/metrics" if path == _METRICS else _route_raw_path(scope)
        await self.interceptor(inner, receive, send)

    def _remember(self, scope: Scope) -> None:
        for key in ("app", "root_path", "extensions"):
            if key in scope:
                self._outer[key] = scope[key]
        if scope["type"] == "lifespan" and "state" in scope:
            self._outer["state"] = scope["state"]

    def _outer_values(self) -> dict[str, Any]:
        """What the in-process request inherits: from the request being served, else what the server last showed."""
        values = dict(self._outer)
        current = _OUTER_SCOPE.get()
        if current is not None:
            for key in ("app", "root_path", "extensions", "state"):
                if key in current:
                    values[key] = current[key]
        return values

    async def _ensure_started(self) -> None:
        if self._ready:
            return
        interceptor = self.interceptor
        if interceptor is None:
            raise ConfigError(f"tokentrail capture is not configured in this vLLM process: {self.config_error}")
        self._started = self._started or asyncio.Lock()
        async with self._started:
            if self._ready:
                return
            if self._spool_parent is None:
                await interceptor.startup()
            else:
                await self._start_with_own_spool(interceptor, Path(self._spool_parent))
            self._ready = True

    async def _start_with_own_spool(self, interceptor: Interceptor, parent: Path) -> None:
        """Claim a per-process spool and start; another process may claim the same one first: try the next."""
        tried: set[Path] = set()
        for _ in range(8):
            directory = await asyncio.to_thread(claim_spool_dir, parent, frozenset(tried))
            interceptor.settings = interceptor.settings.model_copy(update={"spool_dir": directory})
            try:
                await interceptor.startup()
            except DurabilityError:
                tried.add(directory)
                continue
            log.info("tokentrail spool of this process: %s", directory)
            return
        raise DurabilityError(f"no free spool directory under {parent} after {len(tried)} tries")

    def _log_once(self, message: str) -> None:
        if message not in self._logged and len(self._logged) < 64:
            self._logged.add(message)
            log.error("%s", message)

    def _on_lifespan_send(self, send: Send) -> Send:
        async def wrapped(message: Message) -> None:
            if message["type"] == "lifespan.startup.complete" and self.interceptor is not None:
                try:  # claim the spool now, so what a dead process left is drained without waiting for a call
                    await self._ensure_started()
                except Exception as exc:
                    self._log_once(f"tokentrail capture could not start (retried on the next call): {exc!r}")
            if message["type"] == "lifespan.shutdown.complete" and self._ready and self.interceptor is not None:
                await self.interceptor.shutdown()
            await send(message)

        return wrapped


def _route_path(scope: Scope) -> str:
    """The path without the server's root_path (uvicorn puts the root_path in front of ``path``)."""
    path, root = scope.get("path", ""), scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root):len(root) + 1] in ("", "/"):
        return path[len(root):] or "/"
    return path


def _route_raw_path(scope: Scope) -> bytes:
    """``raw_path`` without the server's root_path; rebuilt from ``path`` when the server gave none."""
    raw = scope.get("raw_path") or scope.get("path", "").encode()
    root = scope.get("root_path", "").encode()
    if root and raw.startswith(root) and raw[len(root):len(root) + 1] in (b"", b"/"):
        return raw[len(root):] or b"/"
    return raw


def _unavailable(path: str, message: str) -> Any:
    """A 503 in the calling dialect's error shape."""
    try:
        found = DIALECTS.match(parse_route(path).api_path)
    except ContractError:
        found = None
    spec = found.spec if found is not None else None
    adapter = _adapters().get(spec.name) if spec else None
    if adapter is not None:
        return adapter.error(503, message, "capture_unavailable")
    return error_response(503, message, "capture_unavailable")


@functools.cache
def _adapters() -> dict[str, DialectAdapter]:
    # Built on first use: only a process whose capture is off or failing needs them here.
    return DIALECTS.load_adapters()
