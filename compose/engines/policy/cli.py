"""``tokentrail policy``: run the reference policy server under uvicorn.

Guarantees: settings are validated before anything binds (a bad value exits with status
2 and a message naming it); the socket is bound before uvicorn starts, so ``--port 0``
gets a free port, and ``policy listening on http://HOST:PORT`` is printed (flushed) on
stdout only once the server accepts connections.

``--middleware dotted.path.Class`` registers a class as ``vllm serve --middleware`` does,
with ``app.add_middleware(cls)`` (so it wraps the inner middleware chain, not the app,
and the last one given is outermost), so ``--middleware
producers.middleware.TokentrailMiddleware`` runs the capture inside the engine's own
server process, as a vLLM deployment would. The middleware stack is built before the
socket is bound (vLLM builds it at the first ASGI event), so a middleware that cannot be
constructed, or reports a ``config_error``, stops startup with status 2.

``--honour-prefix`` is accepted and ignored (deprecated): vLLM has no
``required_prefix_token_ids``; prompt ids go in ``kv_transfer_params.prompt_token_ids``.
"""

from __future__ import annotations

import argparse
import importlib
import socket
import sys
from typing import Any, Literal

from pydantic import ValidationError

from compose.engines.policy.settings import FAULTS, PolicySettings
from schemas.errors import TokentrailError


def configure(parser: argparse.ArgumentParser) -> None:
    d = PolicySettings()
    parser.add_argument("--host", default=d.host)
    parser.add_argument("--port", type=int, default=d.port, help="0 picks a free port")
    parser.add_argument("--served-model-name", default=d.served_model_name)
    parser.add_argument("--strict-model", action="store_true",
                        help="404 for unknown model names, as vLLM does (the default; kept for old scripts)")
    parser.add_argument("--lenient-model", action="store_true",
                        help="answer any model name (unlike vLLM, which answers 404)")
    parser.add_argument("--reasoning", action="store_true",
                        help="run as with a reasoning parser: emit <think>...</think> first")
    parser.add_argument("--honour-prefix", action="store_true",
                        help="deprecated, ignored: vLLM has no required_prefix_token_ids "
                             "(send kv_transfer_params.prompt_token_ids)")
    parser.add_argument("--drop-reasoning-in-history", action="store_true",
                        help="template drops reasoning of echoed assistant turns (drift)")
    parser.add_argument("--weight-version", default=d.weight_version,
                        help="weight version label to start with (vLLM's is 'default')")
    parser.add_argument("--forced-tool-format", choices=["json", "markup"], default=d.forced_tool_format,
                        help="what a forced tool_choice makes the model emit (vLLM 0.33: json)")
    parser.add_argument("--logprobs-mode", default=d.logprobs_mode,
                        choices=["raw_logprobs", "processed_logprobs", "raw_logits", "processed_logits"],
                        help="vLLM's --logprobs-mode: what the reported logprob values are")
    parser.add_argument("--vllm-release", choices=["0.33", "0.34"], default=d.vllm_release,
                        help="answer with this vLLM release's shapes and rules (0.33: also the 0.32 CPU build's)")
    parser.add_argument("--enable-sleep-mode", action="store_true",
                        help="serve vLLM 0.34's /checkpoint/prepare, /checkpoint/restore, /checkpoint/status")
    parser.add_argument("--no-dev-mode", action="store_true",
                        help="leave out vLLM's VLLM_SERVER_DEV_MODE routes (/pause, /update_weight_version, ...)")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--fault", action="append", default=[], choices=FAULTS,
                        help="server-wide fault (repeatable)")
    parser.add_argument("--stall-seconds", type=float, default=None)
    parser.add_argument("--stall-after-chunks", type=int, default=d.stall_after_chunks)
    parser.add_argument("--decode-ms-per-token", type=float, default=d.decode_ms_per_token,
                        help="emulated decode time per generated token (benchmarks)")
    parser.add_argument("--default-tool-calls", type=int, default=d.default_tool_calls)
    parser.add_argument("--max-model-len", type=int, default=d.max_model_len)
    parser.add_argument("--table-rows", type=int, default=d.table_rows)
    parser.add_argument("--logit-scale", type=float, default=d.logit_scale)
    parser.add_argument("--vocab-words", type=int, default=None)
    parser.add_argument("--middleware", action="append", default=[], metavar="DOTTED.PATH",
                        help="ASGI middleware class to wrap the app with, as vllm serve --middleware (repeatable)")
    parser.add_argument("--log-level", default="warning",
                        choices=["critical", "error", "warning", "info", "debug"])


def settings_from_args(args: argparse.Namespace) -> PolicySettings:
    return PolicySettings(
        host=args.host, port=args.port, served_model_name=args.served_model_name,
        strict_model=not args.lenient_model, reasoning=args.reasoning,
        honour_prefix=args.honour_prefix, drop_reasoning_in_history=args.drop_reasoning_in_history,
        weight_version=args.weight_version, forced_tool_format=args.forced_tool_format,
        vllm_release=args.vllm_release, sleep_mode=args.enable_sleep_mode,
        dev_mode=not args.no_dev_mode, logprobs_mode=args.logprobs_mode, seed=args.seed,
        faults=frozenset(args.fault),
        stall_seconds=args.stall_seconds, stall_after_chunks=args.stall_after_chunks,
        default_tool_calls=args.default_tool_calls, decode_ms_per_token=args.decode_ms_per_token, max_model_len=args.max_model_len,
        table_rows=args.table_rows, logit_scale=args.logit_scale, vocab_words=args.vocab_words,
    )


def main(args: argparse.Namespace) -> int:
    try:
        settings = settings_from_args(args)
    except ValidationError as exc:
        print(f"tokentrail policy: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    import uvicorn

    if args.honour_prefix:
        print("tokentrail policy: --honour-prefix is deprecated and ignored (vLLM has no "
              "required_prefix_token_ids; send kv_transfer_params.prompt_token_ids)", file=sys.stderr)
    try:
        app = build_app(settings, args.middleware)
    except (ImportError, AttributeError, ValueError, TypeError, TokentrailError) as exc:
        print(f"tokentrail policy: --middleware: {exc}", file=sys.stderr)
        return 2
    try:
        sock = bind_socket(settings.host, settings.port)
    except OSError as exc:
        print(f"tokentrail policy: cannot bind {settings.host}:{settings.port}: {exc}", file=sys.stderr)
        return 1
    port = sock.getsockname()[1]
    host = f"[{settings.host}]" if sock.family == socket.AF_INET6 else settings.host
    url = f"http://{host}:{port}"

    class _Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if not self.should_exit:
                print(f"policy listening on {url}", flush=True)

    # Middleware may hold resources to release at shutdown (the capture's Kafka producer).
    lifespan: Literal["auto", "off"] = "auto" if args.middleware else "off"
    config = uvicorn.Config(app, log_level=args.log_level, access_log=False, lifespan=lifespan)
    _Server(config).run(sockets=[sock])
    return 0


def bind_socket(host: str, port: int) -> socket.socket:
    """A bound TCP socket whose accepted connections asyncio sets TCP_NODELAY on.

    proto must be IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets
    whose proto says TCP, and without it a response written in two parts (headers,
    body) waits out the client's delayed ACK, about 40 ms per call."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def build_app(settings: PolicySettings, middleware: list[str]) -> Any:
    """The app with each ``--middleware`` registered as vLLM registers it, its stack built now."""
    from compose.engines.policy.server import create_app

    app = create_app(settings)
    for path in middleware:
        middleware_class: Any = _import_class(path)  # an ASGI middleware class, unchecked as vLLM takes it
        app.add_middleware(middleware_class)  # what vllm serve --middleware does
    if middleware:
        app.middleware_stack = app.build_middleware_stack()  # Starlette would build it at the first event
        _raise_config_errors(app.middleware_stack)
    return app


def _raise_config_errors(stack: object) -> None:
    """A middleware that came up without its settings (``config_error``) stops startup here."""
    layer, seen = stack, 0
    while layer is not None and seen < 64:
        error = getattr(layer, "config_error", None)
        if error:
            raise ValueError(f"{type(layer).__name__}: {error}")
        layer, seen = getattr(layer, "app", None), seen + 1


def _import_class(path: str) -> type:
    """``pkg.module.Class`` (vLLM's form) or ``pkg.module:Class``."""
    module, sep, name = path.rpartition(":") if ":" in path else path.rpartition(".")
    if not sep or not module or not name:
        raise ValueError(f"{path!r} is not an import path like producers.middleware.TokentrailMiddleware")
    return getattr(importlib.import_module(module), name)
