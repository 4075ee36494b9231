"""The capture interceptor: a pure ASGI app in front of an OpenAI-compatible model server.

``Interceptor`` is ASGI, lifespan and dispatch only. Prefixes (``producers.http.routing``):
the capture prefix ``/ng-rollout/<id>/training-token-capture/``, the evaluation prefix
``/ng-rollout/<id>/``, bare paths; control routes behind a bearer token
(``producers.http.control``), ``/metrics``, ``/healthz``. What each (method, API path) gets
(capture: ``producers.call.generation``; correlate and forward: ``producers.http.replies.forward``;
count: ``producers.call.count``; refuse: a 404/405 naming the route) is the route table's, ``producers.http.route_policy``.

Before any handler runs, in this order: a path with a dot segment (``.``/``..``, raw or
percent-encoded: ``producers.http.routing.PATH_RULE``) is a 400, checked before any route is
decided; then (``producers.http.admission``) an invalid rollout id or unsendable path is a 400; with ``rollout_secret`` a request under ``/ng-rollout/<id>/``
without that rollout's token is a 401; there, a malformed ``x-tokentrail-trace`` header a 400;
a refused route a 404/405; a capture call of a rollout this interceptor finished a 409
(``producers.http.finished``: one record per rollout attempt); a body over
``max_body_bytes`` a 413. Each names what to fix, records nothing and forwards nothing
(counted in ``tokentrail_requests_refused``).

Guarantee (ARCHITECTURE §6.1): a successful model response under the capture
prefix (or its terminal stream event) is sent only after its CallCaptured or
CallIncomplete is durable: acknowledged by Kafka (acks=all), or fsynced to the
local spool when Kafka is down. Token fields never reach the client.

Every handler gets the ``CaptureServices`` built by ``startup()`` (``producers.services``),
never the Interceptor; until startup completed, every route but ``/metrics`` and
``/healthz`` answers 503 in the caller's dialect. With prefix supply, startup refuses
an engine that cannot render chat requests or ignores supplied prompt ids. The engine's
headers follow ``producers.http.replies.upstream_headers``.

Paths come from the ASGI scope (``producers.http.routing``), never from Starlette's
re-parsed ``request.url``, which deletes tab/CR/LF. A path that cannot be forwarded
(``//...``, a control character) is a 400 naming it, in the caller's dialect.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from producers.call import large_bodies
from producers.call.count import handle_count
from producers.call.generation import handle_generation
from producers.capture.core import CaptureCore
from producers.capture.events import default_source
from producers.dialects.base import DialectAdapter
from producers.dialects.registry import DIALECTS, DialectRegistry
from producers.engine.info import EngineCatalog
from producers.http import replies
from producers.http.admission import (
    BODY_READ,
    BodyTooLarge,
    ClientGone,
    declared_too_large,
    drain,
    read_body,
    replay,
    rollout_refusal,
    trace_refusal,
)
from producers.http.control import handle_control
from producers.http.finished import finished_call_message
from producers.http.route_policy import Policy, decide
from producers.http.routing import is_control, parse_route, path_rule_problem, scope_paths
from producers.metrics import InterceptorMetrics
from producers.services import CaptureServices, engine_client, follow_versions, open_services, probe_prefix_supply_of
from producers.settings import InterceptorSettings
from schemas.errors import ContractError, TokentrailError
from schemas.kafka.bridge import AckedProducer
from schemas.kafka.config import producer_config
from schemas.records import IncompleteReason

__all__ = ["Interceptor", "NotStarted"]

log = logging.getLogger("tokentrail.interceptor")

_STARTING = "tokentrail is starting: the capture is not ready yet; retry the call in a moment"


class NotStarted(TokentrailError):
    """The interceptor's services were asked for before ``startup()`` completed."""


class AdmittedRequest(Request):
    """A request whose body admission already read: ``body()`` hands out those very bytes.

    Starlette's ``body()`` joins what ``stream()`` yields (the body, then ``b""``) into a new bytes object:
    a copy of every body on the loop, ~10-45 ms for each 15 MB one (fresh pages), four at once a stall of
    the loop of over 100 ms (``python -m compose.tools.large_bodies``). ``stream()`` (forwarding) still
    reads the replayed receive, so a disconnect is still seen.
    """

    def __init__(self, scope: Scope, receive: Receive, body: bytes) -> None:
        super().__init__(scope, replay(body, receive))
        self._admitted = body

    async def body(self) -> bytes:
        return self._admitted


class Interceptor:
    """ASGI application. Publisher and upstream client are created at startup unless injected."""

    def __init__(
        self,
        settings: InterceptorSettings,
        *,
        publisher: AckedProducer | None = None,
        upstream: httpx.AsyncClient | None = None,
        adapters: dict[str, DialectAdapter] | None = None,
        dialects: DialectRegistry | None = None,
    ) -> None:
        self.settings = settings
        self.source = settings.source or default_source()
        self.metrics = InterceptorMetrics()
        self.dialects = dialects or DIALECTS
        self.adapters = adapters or self.dialects.load_adapters()
        self._publisher = publisher
        self._upstream = upstream
        self._services: CaptureServices | None = None  # set once, by startup()
        self._versions: Any = None  # the policy-versions follower (schemas.kafka.versions), when following

    @property
    def services(self) -> CaptureServices:
        """What the handlers run on; NotStarted before ``startup()`` completed."""
        if self._services is None:
            raise NotStarted("Interceptor.startup() has not run")
        return self._services

    @property
    def core(self) -> CaptureCore:
        return self.services.core

    # -- ASGI -----------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        response = await self.dispatch(Request(scope, receive))
        if response.status_code >= 400 and not scope.get(BODY_READ):
            # Refused before its body was read: read the rest (discarded) before answering, so the connection
            # never closes on unread bytes, which resets it under the client (producers.http.admission.drain).
            if not await drain(receive, self.settings.max_body_bytes):
                response.headers["connection"] = "close"
        await response(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:  # report, so uvicorn exits with the reason
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                large_bodies.freeze_startup_heap()  # the proxy's process is ours (never the middleware's)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def startup(self) -> None:
        """Probe the engine (prefix supply), connect, claim the spool, build the services.

        May be retried after a failure (the vLLM middleware does, with another spool): a
        publisher or client created by a failed try is kept for the next.
        """
        s = self.settings
        if s.kafka.secured:  # refused credentials stop the start; an unreachable broker does not (the spool)
            from schemas.kafka.bridge import check_credentials

            await asyncio.to_thread(check_credentials, s.bootstrap, s.kafka, timeout_s=10.0)
        catalog = EngineCatalog()
        if s.prefix_supply:
            injected = self._upstream is not None
            upstream = self._upstream = self._upstream or engine_client(s)
            try:
                await probe_prefix_supply_of(s, upstream, catalog)
            except BaseException:
                if not injected:
                    await upstream.aclose()
                    self._upstream = None
                raise
        if self._publisher is None:
            self._publisher = AckedProducer(
                producer_config(s.bootstrap, linger_ms=s.linger_ms, delivery_timeout_ms=s.publish_timeout_ms,
                                security=s.kafka),
                name="kafka-publisher-poll")
        if self._upstream is None:
            self._upstream = engine_client(s)
        self._services = open_services(s, self._publisher, self._upstream, metrics=self.metrics, source=self.source,
                                       catalog=catalog)
        if s.follow_versions and self._versions is None:
            self._versions = await follow_versions(s, self._services.core.clock)

    async def shutdown(self) -> None:
        if self._versions is not None:
            await asyncio.to_thread(self._versions.close)
            self._versions = None
        if self._services is not None:
            await self._services.tasks.wait(timeout=30)
            await self._services.core.writer.close()
            await self._services.bodies.close()
        if self._upstream is not None:
            await self._upstream.aclose()
        if self._publisher is not None:
            left = await self._publisher.close()
            if left:
                log.error("%d events were not flushed to Kafka at shutdown", left)

    # -- dispatch -------------------------------------------------------------
    async def dispatch(self, request: Request) -> Response:
        # The scope's path, not request.url.path: Starlette rebuilds the URL through urlsplit, which deletes
        # tab/CR/LF and would rewrite a rollout id (producers.http.routing).
        path, raw_path = scope_paths(request.scope)
        if path == "/metrics":
            return Response(self.metrics.render(), media_type=self.metrics.content_type)
        svc = self._services
        if path == "/healthz":
            # The version the next call is recorded under, and whence (announced: the topic; admin: the route).
            clock = svc.core.clock if svc else None
            return replies.json_response({"status": "ok", "spooled": svc.core.writer.spooled if svc else 0,
                                       "policy_version": clock.label if clock else None,
                                       "policy_version_origin": (clock.origin or None) if clock else None,
                                       # False while a follower that could not start yet is retried
                                       "following_versions": self._versions is not None
                                       and getattr(self._versions, "follower", self._versions) is not None,
                                       # The id it reports applied versions under (announcers name it), and
                                       # whether its announced label is trusted now (the lease: version_feed).
                                       "version_instance": getattr(self._versions, "report_as", None)
                                       if getattr(self._versions, "reporting", False) else None,
                                       "policy_version_fresh": (not clock.leased or clock.fresh) if clock else None})
        # Before any route is decided: no dot segment, decoded or raw (producers.http.routing.PATH_RULE).
        problem = path_rule_problem(path, raw_path)
        if problem is not None:
            return self._refuse(path, 400, problem, "invalid_request_error", "path")
        if svc is None:
            return self.error_for(path, 503, _STARTING, "capture_unavailable")
        if is_control(path):
            admitted = await self._admit_body(request, path)
            return admitted if isinstance(admitted, Response) else await handle_control(svc, admitted, path, raw_path)
        try:
            route = parse_route(path, raw_path)
        except ContractError as exc:
            return self.error_for(path, 400, str(exc), "invalid_rollout_id")
        problem = replies.path_problem(route.api_path)
        if problem is not None:
            return self.error_for(path, 400, problem, "invalid_request_error")
        if route.rollout_id is not None:
            refusal = rollout_refusal(self._rollout_secret(), route.rollout_id, request.headers)
            if refusal is not None:
                return self._refuse(path, 401, refusal, "authentication_error", "rollout_token")
            refusal = trace_refusal(request.headers)
            if refusal is not None:
                return self._refuse(path, 400, refusal, "invalid_request_error", "trace_header")
        decision = decide(route.kind, request.method, route.api_path, self.dialects,
                          forward_unknown=self.settings.forward_unknown_routes)
        if decision.policy is Policy.REFUSE:
            kind = "not_found_error" if decision.status == 404 else "method_not_allowed"
            return self._refuse(path, decision.status, decision.message, kind, "route")
        if decision.policy is Policy.CAPTURE and route.rollout_id is not None:
            finished = svc.finished.finished(route.rollout_id)  # one dict lookup
            if finished is not None:
                return self._refuse(path, 409, finished_call_message(route.rollout_id, finished), "rollout_finished",
                                    "rollout_finished")
        admitted = await self._admit_body(request, path)
        if isinstance(admitted, Response):
            return admitted
        if decision.policy is Policy.COUNT:
            return await self._count(svc, admitted, route.api_path)
        if decision.policy is not Policy.CAPTURE or route.rollout_id is None:
            return await self.forward(svc, admitted, route.api_path)
        spec = self.dialects.for_path(route.api_path)
        assert spec is not None  # the table captures only a dialect's route
        adapter = self.adapters.get(spec.name)
        if adapter is None:
            return await self._uncapturable(svc, admitted, route.rollout_id, route.api_path, f"the {spec.name} dialect")
        return await handle_generation(svc, admitted, route.rollout_id, route.api_path, adapter)

    async def _count(self, svc: CaptureServices, request: Request, api_path: str) -> Response:
        """A dialect's token count (route policy ``count``), answered by its adapter; nothing is recorded."""
        found = self.dialects.match(api_path)
        adapter = self.adapters.get(found.spec.name) if found is not None else None
        if adapter is None or not callable(getattr(adapter, "count_request", None)):
            return self.error_for(api_path, 404, f"POST {api_path}: no adapter of this interceptor counts tokens "
                                                 "for this dialect; nothing was forwarded or recorded", "not_found_error")
        return await handle_count(svc, request, api_path, adapter)

    # -- admission (producers.http.admission) ----------------------------------------
    def _rollout_secret(self) -> bytes | None:
        secret = self.settings.rollout_secret
        return None if secret is None else secret.get_secret_value().encode()

    def _refuse(self, path: str, status: int, message: str, kind: str, why: str) -> Response:
        """A request refused before any handler: nothing recorded, nothing forwarded; counted by ``why``."""
        self.metrics.refused.labels(why=why).inc()
        log.info("refused %s (%s): %s", path, why, message)
        return self.error_for(path, status, message, kind)

    async def _admit_body(self, request: Request, path: str) -> Request | Response:
        """The request with its body read within ``max_body_bytes`` (replayed to the handler), or the 413."""
        limit = self.settings.max_body_bytes
        declared = declared_too_large(request.headers, limit)
        if declared is not None:
            return self._refuse(path, 413, declared, "request_too_large", "body_size")
        request.scope[BODY_READ] = True  # read below, to its end or its limit: nothing to drain after
        try:
            body = await read_body(request.receive, limit)
        except BodyTooLarge as exc:
            return self._refuse(path, 413, str(exc), "request_too_large", "body_size")
        except ClientGone as exc:  # nobody is left to answer; nothing was recorded or forwarded
            return self.error_for(path, 400, str(exc), "invalid_request_error")
        return AdmittedRequest(request.scope, request.receive, body)

    # -- forwarding -----------------------------------------------------------
    def _shape(self, path: str) -> replies.ErrorShape:
        """The error shape of the dialect whose API route ``path`` names (OpenAI's when it names none)."""
        spec = self.dialects.for_suffix(path)
        adapter = self.adapters.get(spec.name) if spec else None
        return adapter.error if adapter is not None else replies.error_response

    def error_for(self, path: str, status: int, message: str, kind: str) -> Response:
        """An error in the dialect of the API route ``path`` names (OpenAI's shape when it names none)."""
        return self._shape(path)(status, message, kind)

    async def forward(self, svc: CaptureServices, request: Request, api_path: str) -> Response:
        """Stream a request to the engine and its answer back, unchanged."""
        return await replies.forward(svc.upstream, request, api_path, svc.upstream_headers(request),
                                  self._shape(api_path))

    async def _uncapturable(self, svc: CaptureServices, request: Request, rollout_id: str, api_path: str,
                            what: str) -> Response:
        """A generating call this build cannot capture: forward it and mark the rollout incomplete (fail closed)."""
        if not await svc.core.incomplete(rollout_id, None, IncompleteReason.CAPTURE_UNSUPPORTED, api_path, None,
                                         f"{what} is not captured by this interceptor"):
            return replies.durability_error()
        return await self.forward(svc, request, api_path)
