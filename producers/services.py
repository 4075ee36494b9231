"""What the interceptor's handlers depend on: ``CaptureServices``, built whole before the app serves.

Guarantees: ``open_services`` returns only a running capture (its durable writer
started, its spool claimed, its lineage index and engine catalog in place), so no
handler ever sees a half-built one; a handler reaches nothing of the Interceptor
but these fields. ``probe_prefix_supply_of`` raises ConfigError (startup fails)
unless the engine renders chat requests and honours supplied prompt ids.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import httpx
from starlette.requests import Request

from producers.call.large_bodies import LargeBodies
from producers.capture.core import CaptureCore
from producers.capture.durable import DurableWriter
from producers.capture.lineage_index import LineageIndex
from producers.capture.spool import Spool
from producers.capture.version_clock import VersionClock
from producers.engine.derender import GENERATE_PATH
from producers.engine.direct import EngineClient
from producers.engine.generate_probe import probe_generate_stream
from producers.engine.info import CHAT_PATH, EngineCatalog, probe_prefix_supply
from producers.http import replies
from producers.http.finished import FinishedRollouts
from producers.metrics import InterceptorMetrics
from producers.settings import InterceptorSettings
from schemas.kafka.bridge import AckedProducer

log = logging.getLogger("tokentrail.interceptor")

__all__ = ["CaptureServices", "TaskTracker", "engine_client", "follow_versions", "open_services", "probe_prefix_supply_of"]


@dataclass(slots=True)
class TaskTracker:
    """Background tasks (stream pumps) kept alive until they end, and awaited at shutdown."""

    _tasks: set[asyncio.Task] = field(default_factory=set)

    def track(self, task: asyncio.Task) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def wait(self, timeout: float) -> None:
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=timeout)


@dataclass(frozen=True, slots=True)
class CaptureServices:
    """The dependencies of every handler, fixed for the life of the app.

    ``core`` runs a call and holds its evidence path (writer, lineage index, engine
    catalog, admin policy version); ``upstream`` is the engine; ``settings`` carries the
    header policy (``upstream_api_key``) and the control token; ``tasks`` keeps stream
    pumps alive; ``metrics`` and ``source`` are the core's own; ``finished`` is the book of
    the rollouts this interceptor finished (``producers.http.finished``); ``bodies`` the threads large
    request bodies are prepared in (``producers.call.large_bodies``).
    """

    core: CaptureCore
    upstream: httpx.AsyncClient
    settings: InterceptorSettings
    tasks: TaskTracker
    metrics: InterceptorMetrics
    source: str
    finished: FinishedRollouts = field(default_factory=FinishedRollouts)
    bodies: LargeBodies = field(default_factory=LargeBodies)

    def upstream_headers(self, request: Request) -> dict[str, str | bytes]:
        """The harness's headers for the engine, under this interceptor's credential policy."""
        return replies.upstream_headers(request.headers, self.settings.upstream_api_key)


def engine_client(settings: InterceptorSettings) -> EngineClient:
    """The pooled client to the engine at ``settings.upstream_url``: httpx's API over aiohttp's connections.

    aiohttp's pool and C HTTP parser cost ~0.5 ms less CPU per 8k/512 call than httpcore's (and its pool
    bookkeeping is linear in its connections, which httpcore 1.0.9's is not: encode/httpx#3215).
    Everything above the transport (requests, streaming, errors as httpx exceptions) is httpx's.
    """
    # Idle connections are dropped after 2 s, well before the engine's server closes them (uvicorn's
    # and vLLM's keep-alive is 5 s): a connection reused just as the server closes it fails the request.
    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=256, keepalive_expiry=2.0)
    import aiohttp

    transport = _engine_transport(limits)

    def session() -> aiohttp.ClientSession:  # the transport's own, created on first use as it does
        if not isinstance(transport.client, aiohttp.ClientSession):
            transport.client = transport.get_client()
        return transport.client

    return EngineClient(
        session=session,
        replay=_engine_dropped,
        read_timeout=settings.engine_timeout_s,
        base_url=settings.upstream_url,
        timeout=httpx.Timeout(settings.engine_timeout_s, connect=10.0),  # a backstop: generation owns its deadlines
        transport=transport,
    )


def _engine_transport(limits: httpx.Limits) -> Any:
    # Imported here: only the proxy builds an engine client. The middleware, loaded into vLLM's own
    # environment (which lacks httpx-aiohttp), reaches its engine through an in-process transport.
    from httpx_aiohttp import AiohttpTransport

    class EngineTransport(AiohttpTransport):
        """Sends a request again, once, on a new connection when the pooled one it went out on had been closed
        by the engine before any answer (aiohttp's ServerDisconnectedError): the engine never took it (or, if
        it had, aborts it for the closed connection), so nothing is generated twice for a harness."""

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            try:
                return await super().handle_async_request(request)
            except httpx.TransportError as exc:
                if not _engine_dropped(exc) or not _replayable(request):
                    raise
                return await super().handle_async_request(request)

    return EngineTransport(limits=limits)


def _engine_dropped(exc: httpx.TransportError) -> bool:
    """Whether the engine closed the pooled connection before any answer (aiohttp's ServerDisconnectedError):
    it never took the request (or, if it had, aborts it for the closed connection), so it may be sent once more."""
    import aiohttp

    return isinstance(exc.__cause__, aiohttp.ServerDisconnectedError)


def _replayable(request: httpx.Request) -> bool:
    try:
        request.content  # noqa: B018 - a body sent from memory can be sent again; a streamed one cannot
    except httpx.RequestNotRead:
        return False
    return True


async def probe_prefix_supply_of(settings: InterceptorSettings, upstream: httpx.AsyncClient,
                                 catalog: EngineCatalog) -> None:
    """ConfigError (startup fails) unless the engine can take supplied prompt ids; notes on ``catalog`` whether it
    streams derendered generations from them (vLLM 0.34's route for streamed calls)."""
    key = settings.upstream_api_key
    auth = {"authorization": f"Bearer {key.get_secret_value()}"} if key else {}
    info = await catalog.get(upstream, auth)
    model = settings.upstream_model or (info.names[0] if info else None)
    await probe_prefix_supply(upstream, auth, model)
    why = await probe_generate_stream(upstream, auth, model)
    catalog.streams_derender = not why
    if why:
        log.info("prefix supply sends ids as kv_transfer_params on %s (vLLM 0.32's way): %s", CHAT_PATH, why)
    else:
        log.info("prefix supply of streamed calls goes render -> %s (stream, derender): the engine offers it",
                 GENERATE_PATH)


def open_services(settings: InterceptorSettings, publisher: AckedProducer, upstream: httpx.AsyncClient, *,
                  metrics: InterceptorMetrics, source: str, catalog: EngineCatalog) -> CaptureServices:
    """Claim the spool (DurabilityError when another live process holds it), build the core, start the writer."""
    spool = Spool(settings.spool_dir) if settings.spool_dir is not None else None
    writer = DurableWriter(publisher, spool, bootstrap=settings.bootstrap, security=settings.kafka, on_depth=metrics.spool_depth.set)
    index = LineageIndex(max_rollouts=settings.index_max_rollouts, max_tokens=settings.index_max_tokens,
                         keep_tokens=settings.prefix_supply)
    core = CaptureCore(settings, writer, index, metrics, source, catalog)
    metrics.spool_depth.set(writer.spooled)
    writer.start()
    return CaptureServices(core=core, upstream=upstream, settings=settings, tasks=TaskTracker(), metrics=metrics,
                           source=source, finished=FinishedRollouts(settings.finished_max_rollouts))


async def follow_versions(settings: InterceptorSettings, clock: VersionClock) -> Any:
    """Follow the policy-versions topic into ``clock`` (changes applied on this event loop), reporting what it
    applied (``producers.capture.version_feed``); the follower, or its stand-in that keeps trying to start it
    when the topic cannot be read at startup."""
    from producers.capture.version_feed import follow

    return await follow(settings, clock)
