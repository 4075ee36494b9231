"""The capture interceptor: a pure ASGI app in front of an OpenAI-compatible model server.

Routes (see ``producers.routing``): capture under ``/ng-rollout/<id>/training-token-capture/``,
evaluation correlation under ``/ng-rollout/<id>/``, bare API paths forwarded,
control routes behind a bearer token (constant-time compare), ``/metrics``.

Guarantee (ARCHITECTURE §6.1): a successful model response under the capture
prefix is returned only after its CallCaptured or CallIncomplete event is
acknowledged by Kafka (acks=all). Token fields never reach the client.
"""

from __future__ import annotations

import hmac
import logging
from typing import Any

import httpx
import orjson
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from producers.capture import CallContext, default_source, incomplete_call, make_event
from producers.chat import handle_chat
from producers.http import error_response, json_response
from producers.finish import handle_finish
from producers.metrics import InterceptorMetrics
from producers.publisher import KafkaPublisher, producer_config
from producers.routing import GENERATING, Kind, is_non_generating, parse_route
from producers.settings import InterceptorSettings
from schemas.errors import ContractError, TransportError
from schemas.records import IncompleteReason, RolloutEvent

log = logging.getLogger("tokentrail.interceptor")

# Request headers never forwarded upstream (hop-by-hop, or recomputed by httpx).
_DROP_REQUEST_HEADERS = {"host", "content-length", "connection", "transfer-encoding", "keep-alive", "upgrade"}
_DROP_RESPONSE_HEADERS = {"content-length", "connection", "transfer-encoding", "keep-alive", "content-encoding"}


class Interceptor:
    """ASGI application; ``publisher`` and ``upstream`` are created at startup unless injected."""

    def __init__(
        self,
        settings: InterceptorSettings,
        *,
        publisher: KafkaPublisher | None = None,
        upstream: httpx.AsyncClient | None = None,
    ) -> None:
        self.settings = settings
        self.source = settings.source or default_source()
        self.metrics = InterceptorMetrics()
        self._publisher = publisher
        self._upstream = upstream
        self.admin_policy_version: str | None = None

    # -- ASGI -----------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        response = await self.dispatch(Request(scope, receive))
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
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def startup(self) -> None:
        if self._publisher is None:
            self._publisher = KafkaPublisher(
                producer_config(self.settings.bootstrap, linger_ms=self.settings.linger_ms,
                                delivery_timeout_ms=self.settings.publish_timeout_ms)
            )
        if self._upstream is None:
            self._upstream = httpx.AsyncClient(
                base_url=self.settings.upstream_url,
                timeout=httpx.Timeout(self.settings.upstream_timeout_s, connect=10.0),
                limits=httpx.Limits(max_connections=1024, max_keepalive_connections=256),
            )

    async def shutdown(self) -> None:
        if self._upstream is not None:
            await self._upstream.aclose()
        if self._publisher is not None:
            left = await self._publisher.close()
            if left:
                log.error("%d events were not flushed to Kafka at shutdown", left)

    @property
    def upstream(self) -> httpx.AsyncClient:
        assert self._upstream is not None, "Interceptor.startup() has not run"
        return self._upstream

    # -- dispatch -------------------------------------------------------------
    async def dispatch(self, request: Request) -> Response:
        path = request.url.path
        if path == "/metrics":
            return Response(self.metrics.render(), media_type=self.metrics.content_type)
        if path == "/healthz":
            return json_response({"status": "ok"})
        if path.startswith("/rollouts/") or path.startswith("/tokentrail/admin/"):
            return await self._control(request)
        try:
            route = parse_route(path)
        except ContractError as exc:
            return error_response(400, str(exc), "invalid_rollout_id")
        if route.kind is not Kind.CAPTURE:
            return await self.forward(request, route.api_path)
        assert route.rollout_id is not None
        dialect = GENERATING.get(route.api_path.rstrip("/"))
        if dialect == "chat" and request.method == "POST":
            return await handle_chat(self, request, route.rollout_id, route.api_path)
        if dialect is not None and request.method == "POST":
            return await self.forward_uncaptured(request, route.rollout_id, route.api_path, f"the {dialect} dialect")
        if is_non_generating(route.api_path):
            return await self.forward(request, route.api_path)
        return await self._forward_unknown(request, route.rollout_id, route.api_path)

    async def _control(self, request: Request) -> Response:
        if not self._authorized(request):
            return error_response(401, "control routes need 'Authorization: Bearer <token>' matching "
                                       "TOKENTRAIL_CONTROL_TOKEN", "unauthorized")
        parts = request.url.path.strip("/").split("/")
        if len(parts) == 3 and parts[0] == "rollouts" and parts[2] == "finish" and request.method == "POST":
            return await handle_finish(self, request, parts[1])
        if request.url.path == "/tokentrail/admin/policy-version" and request.method == "POST":
            try:
                version = orjson.loads(await request.body())["version"]
            except (ValueError, KeyError, TypeError):
                return error_response(400, 'body must be {"version": "<policy version>"}', "invalid_request_error")
            self.admin_policy_version = None if version is None else str(version)
            return json_response({"policy_version": self.admin_policy_version})
        return error_response(404, f"no control route {request.method} {request.url.path}", "not_found")

    def _authorized(self, request: Request) -> bool:
        token = self.settings.control_token
        if token is None:
            return False
        given = request.headers.get("authorization", "")
        expected = f"Bearer {token.get_secret_value()}"
        return hmac.compare_digest(given.encode(), expected.encode())

    # -- upstream -------------------------------------------------------------
    def upstream_body(self, body: dict[str, Any]) -> dict[str, Any]:
        """The request sent to the engine: the harness's body, the sampling pin, and what capture needs."""
        out = dict(body)
        out.update(self.settings.sampling_overrides)
        out["return_token_ids"] = True
        out["logprobs"] = True
        if not isinstance(body.get("top_logprobs"), int) or body.get("top_logprobs", 0) < 0:
            out["top_logprobs"] = 0
        out["include_reasoning"] = True  # vLLM suppresses token ids when reasoning is hidden
        return out

    def upstream_headers(self, request: Request) -> dict[str, str]:
        return {k: v for k, v in request.headers.items() if k.lower() not in _DROP_REQUEST_HEADERS}

    def policy_version_of(self, data: dict[str, Any]) -> tuple[str | None, str]:
        """Engine-reported weight version when present, else the one the trainer set via the admin route."""
        for holder in (data, *(data.get("choices") or [])):
            value = holder.get("weight_version") if isinstance(holder, dict) else None
            if value is not None:
                return str(value), "engine"
        if self.admin_policy_version is not None:
            return self.admin_policy_version, "admin"
        return None, ""

    async def forward(self, request: Request, api_path: str) -> Response:
        """Stream a request to the engine and its answer back, unchanged."""
        url = httpx.URL(path=api_path, query=request.url.query.encode())
        upstream_request = self.upstream.build_request(
            request.method, url, headers=self.upstream_headers(request), content=request.stream()
        )
        try:
            upstream = await self.upstream.send(upstream_request, stream=True)
        except httpx.HTTPError as exc:
            return error_response(502, f"model server unreachable: {exc!r}", "upstream_error")
        headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _DROP_RESPONSE_HEADERS}
        # An in-process transport may hand back an already-read body.
        chunks = iter([upstream.content]) if upstream.is_stream_consumed else upstream.aiter_raw()
        return StreamingResponse(chunks, status_code=upstream.status_code, headers=headers,
                                 background=BackgroundTask(upstream.aclose))

    async def forward_uncaptured(self, request: Request, rollout_id: str, api_path: str, what: str) -> Response:
        """A generating call this build cannot capture: forward it and mark the rollout incomplete (fail closed)."""
        if not await self.record_incomplete(None, "capture_unsupported", api_path, None,
                                            f"{what} is not captured by this interceptor", required=True,
                                            rollout_id=rollout_id):
            return self.durability_error()
        return await self.forward(request, api_path)

    async def _forward_unknown(self, request: Request, rollout_id: str, api_path: str) -> Response:
        response = await self.forward(request, api_path)
        if 200 <= response.status_code < 300:
            # An unknown route that succeeded may have generated tokens we did not see.
            if not await self.record_incomplete(None, IncompleteReason.UNKNOWN_ROUTE, api_path, response.status_code,
                                                f"{request.method} {api_path} answered under the capture prefix",
                                                required=True, rollout_id=rollout_id):
                if response.background is not None:
                    await response.background()
                return self.durability_error()
        return response

    # -- evidence -------------------------------------------------------------
    async def publish(self, rollout_id: str, body: Any) -> None:
        await self.publish_event(make_event(rollout_id, body, self.source))

    async def publish_event(self, event: RolloutEvent) -> None:
        """Return once Kafka acknowledged the event; raise TransportError otherwise."""
        assert self._publisher is not None, "Interceptor.startup() has not run"
        with self.metrics.publish_seconds.time():
            await self._publisher.publish(self.settings.topics.rollout_events, event)

    async def record_incomplete(
        self, ctx: CallContext | None, reason: str, route: str, status: int | None, detail: str, *,
        required: bool, rollout_id: str | None = None,
    ) -> bool:
        """Publish a CallIncomplete; False when it could not be made durable."""
        marker = incomplete_call(ctx, str(reason), route=route, http_status=status, detail=detail)
        try:
            await self.publish(ctx.rollout_id if ctx else str(rollout_id), marker)
        except TransportError as exc:
            log.error("incomplete marker (%s) for rollout %s not durable: %s", reason, ctx.rollout_id if ctx else rollout_id, exc)
            return False if required else True
        self.metrics.incomplete.labels(reason=str(reason)).inc()
        return True

    def durability_error(self) -> Response:
        return error_response(
            503, "tokentrail could not make the capture durable (Kafka unavailable); the call was not "
                 "acknowledged so it cannot be trained on — retry it", "capture_unavailable"
        )
