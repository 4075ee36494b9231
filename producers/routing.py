"""Correlation by URL: which requests are captured, forwarded, or refused (pure).

- ``/ng-rollout/<id>/training-token-capture/<api path>``: capture;
- ``/ng-rollout/<id>/<api path>``: evaluation correlation only (forwarded, never captured);
- any other path: forwarded untouched;
- ``/rollouts/<id>/finish`` and ``/tokentrail/admin/...``: control routes (bearer token),
  never reachable through the ``/ng-rollout/`` prefix.

An invalid rollout id is refused (HTTP 400 naming the rule), never rewritten.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from schemas.ids import validate_rollout_id

ROLLOUT_PREFIX = "ng-rollout"
CAPTURE_SEGMENT = "training-token-capture"


class Kind(Enum):
    CAPTURE = "capture"
    EVAL = "eval"
    BARE = "bare"


@dataclass(frozen=True, slots=True)
class Route:
    kind: Kind
    api_path: str  # the path forwarded upstream (prefix stripped), starting with "/"
    rollout_id: str | None = None


# Generating routes per dialect; everything else under the capture prefix is
# either known to be non-generating (served without masking) or unknown.
GENERATING = {
    "/v1/chat/completions": "chat",
    "/v1/messages": "anthropic",
    "/v1/responses": "responses",
}
NON_GENERATING = ("/v1/models", "/v1/messages/count_tokens", "/health", "/v1/health", "/tokenize", "/detokenize")


def parse_route(path: str) -> Route:
    """Classify a request path; raises ContractError for an invalid rollout id."""
    if not path.startswith(f"/{ROLLOUT_PREFIX}/"):
        return Route(Kind.BARE, path or "/")
    rest = path[len(ROLLOUT_PREFIX) + 2 :]
    rollout_id, _, tail = rest.partition("/")
    validate_rollout_id(rollout_id)
    tail = "/" + tail
    if tail == f"/{CAPTURE_SEGMENT}" or tail.startswith(f"/{CAPTURE_SEGMENT}/"):
        return Route(Kind.CAPTURE, tail[len(CAPTURE_SEGMENT) + 1 :] or "/", rollout_id)
    return Route(Kind.EVAL, tail, rollout_id)


def is_non_generating(api_path: str) -> bool:
    return api_path.rstrip("/") in NON_GENERATING or api_path.startswith("/v1/models/")
