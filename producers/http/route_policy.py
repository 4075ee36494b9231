"""The route policy table: what the interceptor does with each (method, API path) (pure).

Every harness request is decided here, and only here; the standalone interceptor and the vLLM
middleware (which hands everything under ``/ng-rollout/`` to the interceptor) both read it.
A route is *allowed* by being listed; everything else is refused. There is no forwarding by
default, so an engine's admin routes (vLLM's LoRA load/unload, sleep/wake, cache resets,
``collective_rpc``, weight-version updates, pause/resume, abort, elastic scaling; the
reference engine's ``/tokentrail/admin/weight-version``) never reach the engine through the
interceptor: a trainer calls them on the engine itself.

Policies (``Policy``):

* ``capture``: a dialect's generating route (``producers.dialects.registry``), POST, under
  ``/ng-rollout/<id>/training-token-capture/``: captured with its exact token ids.
* ``correlate``: the same routes under ``/ng-rollout/<id>/`` (evaluation): forwarded, never
  captured; the rollout id is in the URL for the harness's own logs.
* ``count``: a dialect's token-counting route (``DialectSpec.count_path``, Gemini's
  ``:countTokens``), POST, on every prefix: answered by the dialect's adapter from the engine's
  ``/tokenize`` (``producers.call.count``); nothing is recorded, so it cannot mask a rollout.
* ``forward``: the read-only routes harness SDKs call (``READ_ONLY``: model lists, token
  counting, health, tokenize), on every prefix; and the generating routes on bare paths.
  Forwarded unchanged; nothing is recorded, so none of them can mask a rollout.
* ``refuse``: anything else (``ENGINE_ADMIN`` names the known engine admin routes, for the
  message): a 404 (a 405 when the path is listed for another method) that names the route,
  the policy and what to do; nothing is forwarded and nothing is recorded.

``forward_unknown=True`` (setting ``forward_unknown_routes``) forwards unlisted routes on bare
paths only, for an operator who fronts a trusted engine; under ``/ng-rollout/`` the table
always holds, so a harness can never reach an admin route or mask a rollout.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from producers.dialects.registry import DialectRegistry
from producers.http.routing import Kind

__all__ = ["ENGINE_ADMIN", "READ_ONLY", "Decision", "Policy", "ReadOnlyRoute", "decide"]


class Policy(Enum):
    CAPTURE = "capture"
    CORRELATE = "correlate"
    COUNT = "count"
    FORWARD = "forward"
    REFUSE = "refuse"


@dataclass(frozen=True, slots=True)
class ReadOnlyRoute:
    methods: tuple[str, ...]
    path: str
    subpaths: bool = False  # also ``path/<anything>`` (GET /v1/models/<id>; ids may contain '/')

    def matches_path(self, api_path: str) -> bool:
        return api_path == self.path or (self.subpaths and api_path.startswith(self.path + "/"))


# The read-only routes the harnesses' SDKs call (the Anthropic SDK: models and count_tokens;
# the OpenAI SDK and Codex: models; health probes; vLLM's tokenizer routes). Each is forwarded
# on every prefix and records nothing.
READ_ONLY: tuple[ReadOnlyRoute, ...] = (
    ReadOnlyRoute(("GET", "HEAD"), "/v1/models", subpaths=True),
    ReadOnlyRoute(("POST",), "/v1/messages/count_tokens"),
    ReadOnlyRoute(("GET", "HEAD"), "/health"),
    ReadOnlyRoute(("GET", "HEAD"), "/v1/health"),
    ReadOnlyRoute(("POST",), "/tokenize"),
    ReadOnlyRoute(("POST",), "/detokenize"),
)

# Known engine admin routes (vLLM 0.32+ and dev mode; the reference engine's). Listed only to
# say so in the refusal: they are refused because they are not allowed, like any unknown route.
ENGINE_ADMIN = (
    "/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/sleep", "/wake_up", "/is_sleeping",
    "/reset_prefix_cache", "/reset_mm_cache", "/collective_rpc", "/update_weight_version",
    "/finish_weight_update", "/weight_info", "/pause", "/resume", "/is_paused", "/abort_requests",
    "/scale_elastic_ep", "/is_scaling_elastic_ep", "/start_profile", "/stop_profile", "/server_info",
    "/tokentrail/admin/weight-version", "/tokentrail/score",
)

_WHERE = {Kind.CAPTURE: "under the capture prefix /ng-rollout/<id>/training-token-capture",
          Kind.EVAL: "under the evaluation prefix /ng-rollout/<id>", Kind.BARE: "on a bare path"}


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do with one request; for ``refuse``, the status and the message the harness gets."""

    policy: Policy
    status: int = 200
    message: str = ""


def decide(kind: Kind, method: str, api_path: str, dialects: DialectRegistry, *,
           forward_unknown: bool = False) -> Decision:
    """The policy of ``method api_path`` reached through a route of ``kind`` (a trailing '/' ignored)."""
    method = method.upper()
    path = api_path.rstrip("/") or "/"
    found = dialects.match(path)  # the registry decides which dialect a path belongs to
    if found is not None and found.count and method == "POST":
        return Decision(Policy.COUNT)
    spec = found.spec if found is not None else None
    if spec is not None and method == "POST":
        return Decision({Kind.CAPTURE: Policy.CAPTURE, Kind.EVAL: Policy.CORRELATE,
                         Kind.BARE: Policy.FORWARD}[kind])
    listed = [r for r in READ_ONLY if r.matches_path(path)]
    if any(method in r.methods for r in listed):
        return Decision(Policy.FORWARD)
    if kind is Kind.BARE and forward_unknown:
        return Decision(Policy.FORWARD)
    allowed = sorted({m for r in listed for m in r.methods} | ({"POST"} if spec is not None else set()))
    shown = path if len(path) <= 200 else path[:200] + "..."  # a hostile path is not echoed whole
    if allowed:
        return Decision(Policy.REFUSE, 405, f"{method} {shown} is not served {_WHERE[kind]} (route policy: refuse); "
                                            f"this path takes {', '.join(allowed)} only")
    what = "an engine admin route, which tokentrail never forwards" if path in ENGINE_ADMIN else \
        "not a route tokentrail serves"
    return Decision(Policy.REFUSE, 404, f"{method} {shown} {_WHERE[kind]} is {what} (route policy: refuse); "
                                        f"nothing was forwarded or recorded. Allowed here: {_allowed(dialects)}. "
                                        "Engine admin calls go to the engine directly, from the trainer.")


def _allowed(dialects: DialectRegistry) -> str:
    generating = [f"POST {path}" for spec in dialects for path in spec.paths()]
    read_only = [f"{'/'.join(r.methods)} {r.path}{'[/<id>]' if r.subpaths else ''}" for r in READ_ONLY]
    return ", ".join(generating + read_only)
