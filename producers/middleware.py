"""The interceptor as ASGI middleware inside vLLM's own server: ``vllm serve ... --middleware producers.middleware.TokentrailMiddleware``.

Same capture core as the standalone proxy; the "upstream" is the wrapped app
itself, called in-process through a streaming ASGI transport (httpx's own
ASGITransport buffers whole responses, which would break true streaming).
Paths under ``/ng-rollout/``, the control routes and ``/tokentrail/metrics`` go
to the interceptor; everything else goes straight to the wrapped app.

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
import json
import logging
import os
import re
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import httpx
from starlette.types import ASGIApp, Receive, Scope, Send

from producers.adapters import openai_error
from producers.app import Interceptor, default_adapters
from producers.routing import GENERATING, parse_route
from producers.settings import InterceptorSettings
from producers.spool import Spool
from schemas.errors import ConfigError, ContractError, DurabilityError
from schemas.topics import topic_names

log = logging.getLogger("tokentrail.interceptor")

_OURS = ("/ng-rollout/", "/rollouts/", "/tokentrail/admin/")
_METRICS = "/tokentrail/metrics"
IN_PROCESS = "http://in-process"


def _flag(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected 1 or 0")


def _json(raw: str) -> Any:
    return json.loads(raw)


# One line per variable: (environment name, InterceptorSettings field, parser).
# An unset or empty variable leaves the field at its default.
ENV_SETTINGS: tuple[tuple[str, str, Callable[[str], Any]], ...] = (
    ("TOKENTRAIL_BOOTSTRAP", "bootstrap", str),  # required
    ("TOKENTRAIL_SPOOL_DIR", "spool_dir", str),  # parent of the per-process spools
    ("TOKENTRAIL_CONTROL_TOKEN", "control_token", str),
    ("TOKENTRAIL_SAMPLING", "sampling_overrides", _json),  # JSON object
    ("TOKENTRAIL_TOPIC_PREFIX", "topics", topic_names),
    ("TOKENTRAIL_PREFIX_SUPPLY", "prefix_supply", _flag),  # 1/0
    ("TOKENTRAIL_DELTA_RECORDS", "delta_records", _flag),  # 1/0
    ("TOKENTRAIL_UPSTREAM_MODEL", "upstream_model", str),  # a name vLLM serves (--served-model-name)
    ("TOKENTRAIL_UPSTREAM_API_KEY", "upstream_api_key", str),  # vLLM's --api-key, sent as Bearer
    ("TOKENTRAIL_LOGPROBS_MODE", "logprobs_mode", str),  # as vLLM's --logprobs-mode
)
_ENV_OF = {field: name for name, field, _ in ENV_SETTINGS}


def settings_from_env(env: dict[str, str] | None = None) -> InterceptorSettings:
    env = dict(os.environ if env is None else env)
    if not env.get("TOKENTRAIL_BOOTSTRAP"):
        raise ConfigError("TOKENTRAIL_BOOTSTRAP is not set: the middleware needs the Kafka bootstrap servers (host:port)")
    values: dict[str, Any] = {"upstream_url": IN_PROCESS}
    for name, field, parse in ENV_SETTINGS:
        raw = env.get(name)
        if not raw:
            continue
        try:
            values[field] = parse(raw)
        except ValueError as exc:  # bad JSON, a flag that is not 1/0 (the value is not echoed: it may be a secret)
            raise ConfigError(f"invalid {name} for the vLLM middleware: {exc}") from exc
    try:
        return InterceptorSettings(**values)
    except ValueError as exc:  # pydantic's ValidationError
        names = sorted({_ENV_OF.get(str(e["loc"][0]), str(e["loc"][0])) for e in exc.errors() if e.get("loc")})  # type: ignore[attr-defined]
        raise ConfigError(f"invalid TOKENTRAIL_* settings for the vLLM middleware ({', '.join(names)}): {exc}") from exc


# -- per-process spools ----------------------------------------------------------------------

_SLOT = re.compile(r"^api-(\d+)$")


def claim_spool_dir(parent: Path, skip: frozenset[Path] = frozenset()) -> Path:
    """The spool directory this process should use under ``parent`` (see the module docstring).

    Candidates are probed by opening them (which takes and then releases the spool's
    flock): one held by a live process is skipped, the first with undrained events wins,
    else the first free empty one, else a new ``api-<k>``. A spool written directly in
    ``parent`` by an older single-process version counts as a candidate too.
    """
    parent.mkdir(parents=True, exist_ok=True)
    slots = sorted((int(m[1]), p) for p in parent.iterdir() if p.is_dir() and (m := _SLOT.match(p.name)))
    candidates = ([parent] if (parent / "spool.log").exists() else []) + [p for _, p in slots]
    free: Path | None = None
    for directory in candidates:
        if directory in skip:
            continue
        try:
            spool = Spool(directory)
        except DurabilityError:  # held by a live process
            continue
        pending = len(spool)
        spool.close()
        if pending:
            log.warning("spool %s holds %d event(s) of a process that is gone; this process drains them first",
                        directory, pending)
            return directory
        if free is None and directory != parent:
            free = directory
    if free is not None:
        return free
    taken = {k for k, _ in slots}
    return parent / f"api-{next(k for k in range(len(taken) + 1) if k not in taken)}"


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
                                       timeout=httpx.Timeout(settings.upstream_timeout_s)),
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
        inner["raw_path"] = inner["path"].encode()
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
        assert self.interceptor is not None
        self._started = self._started or asyncio.Lock()
        async with self._started:
            if self._ready:
                return
            if self._spool_parent is None:
                await self.interceptor.startup()
            else:
                await self._start_with_own_spool(Path(self._spool_parent))
            self._ready = True

    async def _start_with_own_spool(self, parent: Path) -> None:
        """Claim a per-process spool and start; another process may claim the same one first: try the next."""
        assert self.interceptor is not None
        tried: set[Path] = set()
        for _ in range(8):
            directory = await asyncio.to_thread(claim_spool_dir, parent, frozenset(tried))
            self.interceptor.settings = self.interceptor.settings.model_copy(update={"spool_dir": directory})
            try:
                await self.interceptor.startup()
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
        async def wrapped(message: dict[str, Any]) -> None:
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


def _unavailable(path: str, message: str) -> Any:
    """A 503 in the calling dialect's error shape."""
    try:
        dialect = GENERATING.get(parse_route(path).api_path.rstrip("/"))
    except ContractError:
        dialect = None
    adapter = default_adapters().get(dialect) if dialect else None
    if adapter is not None:
        return adapter.error(503, message, "capture_unavailable")
    return openai_error(503, message, "capture_unavailable")


# -- the in-process transport ----------------------------------------------------------------

# Response extensions this transport does not implement are not offered to the engine.
_UNSUPPORTED_EXTENSIONS = frozenset({"http.response.pathsend", "http.response.zerocopy", "http.response.push",
                                     "http.response.trailers", "http.response.early_hint"})


class InProcessEngineError(httpx.TransportError):
    """The in-process engine raised instead of answering (or in the middle of its answer)."""


class StreamingASGITransport(httpx.AsyncBaseTransport):
    """Call an ASGI app in-process and hand its response body over as it is sent (no buffering).

    ``outer`` returns the server scope's ``app``, ``state``, ``root_path`` and ``extensions``
    for the request (Starlette sets ``scope["app"]`` outside the user middleware)."""

    def __init__(self, app: ASGIApp, outer: Callable[[], dict[str, Any]] | None = None) -> None:
        self.app = app
        self.outer = outer or dict

    def _scope(self, request: httpx.Request, body_path: str) -> dict[str, Any]:
        outer = self.outer()
        root = outer.get("root_path", "") or ""
        path = root + body_path
        scope: dict[str, Any] = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": request.method,
            "scheme": request.url.scheme, "path": path, "raw_path": path.encode(),
            "query_string": request.url.query, "root_path": root,
            "headers": [(k.lower(), v) for k, v in request.headers.raw],
            "client": ("127.0.0.1", 0), "server": ("in-process", 80),
        }
        if "app" in outer:
            scope["app"] = outer["app"]
        if isinstance(outer.get("state"), dict):
            scope["state"] = dict(outer["state"])  # per request, like uvicorn's copy of the lifespan state
        if isinstance(outer.get("extensions"), dict):
            scope["extensions"] = {k: v for k, v in outer["extensions"].items() if k not in _UNSUPPORTED_EXTENSIONS}
        return scope

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        scope = self._scope(request, request.url.path)
        sent_body = False
        disconnected = asyncio.Event()

        async def receive() -> dict[str, Any]:
            nonlocal sent_body
            if not sent_body:
                sent_body = True
                return {"type": "http.request", "body": body, "more_body": False}
            await disconnected.wait()
            return {"type": "http.disconnect"}

        start: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        chunks: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue()

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start" and not start.done():
                start.set_result(message)
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    chunks.put_nowait(message["body"])
                if not message.get("more_body", False):
                    chunks.put_nowait(None)

        async def run() -> None:
            try:
                await self.app(scope, receive, send)
            except Exception as exc:
                error = InProcessEngineError(f"the in-process engine raised {exc!r} serving "
                                             f"{request.method} {request.url.path}")
                error.__cause__ = exc
                if not start.done():
                    start.set_exception(error)
                else:
                    chunks.put_nowait(error)
            finally:
                chunks.put_nowait(None)
                if not start.done():
                    start.set_exception(InProcessEngineError(
                        f"the in-process engine returned without answering {request.method} {request.url.path}"))

        task = asyncio.get_running_loop().create_task(run())
        message = await start

        async def stream() -> AsyncIterator[bytes]:
            try:
                while (chunk := await chunks.get()) is not None:
                    if isinstance(chunk, BaseException):
                        raise chunk
                    yield chunk
            finally:
                disconnected.set()
                await task

        return httpx.Response(message["status"], headers=message.get("headers", []),
                              stream=_AsyncStream(stream()), request=request)


class _AsyncStream(httpx.AsyncByteStream):
    def __init__(self, iterator: AsyncIterator[bytes]) -> None:
        self._iterator = iterator

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._iterator:
            yield chunk

    async def aclose(self) -> None:
        await self._iterator.aclose()  # type: ignore[attr-defined]
