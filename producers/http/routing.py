"""Correlation by URL: which prefix a request came through, and its API path (pure).

- ``/ng-rollout/<id>/training-token-capture/<api path>``: the capture prefix;
- ``/ng-rollout/<id>/<api path>``: the evaluation prefix (correlation only, never captured);
- any other path: a bare API path;
- ``/rollouts/<id>/finish`` and ``/tokentrail/admin/...``: control routes (bearer token),
  never reachable through the ``/ng-rollout/`` prefix.

What is done with each (method, API path) on each prefix (capture, correlate, forward,
refuse) is decided by the route policy table, ``producers.http.route_policy``, and only there.

An invalid rollout id is refused (HTTP 400 naming the rule), never rewritten. Paths are read
from the ASGI scope, never from a URL rebuilt out of it: Starlette's ``request.url`` goes
through ``urllib.parse.urlsplit``, which deletes tab, CR and LF (WHATWG URL parsing), so
``/ng-rollout/tab%09x1/...`` would become rollout ``tabx1``. The rollout id is also checked
against the raw path (``raw_path``, percent-decoded segment by segment): ``a%2Fb`` is the id
``a/b`` (refused), not the id ``a`` followed by a path ``b/...``.

Nothing resolves a path (``path_rule_problem``): a ``.`` or ``..`` segment, as sent or
percent-encoded (``%2e``, twice encoded ``%252e``), or hidden behind an encoded separator
(``..%2f``, ``..%5c``), is refused at the edge, before any route is decided, on the decoded
path and on the raw one. Otherwise the route table would judge ``/v1/models/../../sleep``
while the HTTP client, which resolves dot segments when it builds the engine URL, sent
``/sleep``. The engine URL is then built from the checked path with every ``%`` encoded
(``producers.http.replies.engine_path``), so the engine decodes exactly the path decided on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Any
from urllib.parse import unquote

from schemas.errors import ContractError
from schemas.ids import ROLLOUT_ID_RULE, validate_rollout_id

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


CONTROL_PREFIXES = ("/rollouts/", "/tokentrail/admin/")

PATH_RULE = ("a request path must not contain '.' or '..' segments, as sent or percent-encoded ('%2e', '%252e'), "
             "nor one behind an encoded separator ('..%2f', '..%5c')")
_SEPARATORS = re.compile(r"[/\\]")
_DOTS = (".", "..")


def _has_dot_segment(text: str) -> bool:
    """Whether ``text`` (a path) has a dot segment as it is, decoded once, or decoded twice ('/' and '\\' split)."""
    for _ in range(3):
        if any(part in _DOTS for part in _SEPARATORS.split(text)):
            return True
        if "%" not in text:
            return False
        text = unquote(text)
    return False


def path_rule_problem(path: str, raw_path: bytes | bytearray | None = None) -> str | None:
    """Why the request path breaks ``PATH_RULE`` (a 400 naming it), or None; the decoded and the raw path.

    A few string operations for an ordinary path: one without '.' and '%' is not even split.
    """
    raw = None
    if raw_path is not None:
        raw = bytes(raw_path).partition(b"?")[0].decode("latin-1")
    bad = ((("." in path or "%" in path) and _has_dot_segment(path))
           or (raw is not None and raw != path and ("." in raw or "%" in raw) and _has_dot_segment(raw)))
    if not bad:
        return None
    shown = raw if raw is not None else path
    shown = shown if len(shown) <= 200 else shown[:200] + "..."
    return (f"invalid request path {shown!r}: {PATH_RULE} (route policy: path rule); tokentrail resolves no dot "
            "segment, so the route decided on is the route the engine gets: send the route's own path, e.g. "
            "/v1/models/<id>, not /v1/models/../<route>; nothing was recorded or forwarded")


def scope_paths(scope: Any) -> tuple[str, bytes | bytearray | None]:
    """The request's (percent-decoded) path and its raw path, as the server gave them (never re-parsed)."""
    raw = scope.get("raw_path")
    return scope.get("path") or "/", raw if isinstance(raw, (bytes, bytearray)) else None


def raw_segments(raw_path: bytes | bytearray | None) -> list[str] | None:
    """The raw path's segments, each percent-decoded (an encoded ``/`` stays inside its segment)."""
    if raw_path is None:
        return None
    raw = bytes(raw_path).partition(b"?")[0].decode("latin-1")
    return [unquote(segment) for segment in raw.split("/")[1:]]


def check_raw_rollout_id(rollout_id: str, raw_path: bytes | bytearray | None, index: int) -> None:
    """ContractError unless segment ``index`` of the raw path decodes to exactly ``rollout_id``."""
    segments = raw_segments(raw_path)
    if segments is None:
        return
    raw_id = segments[index] if index < len(segments) else ""
    if raw_id != rollout_id:
        validate_rollout_id(raw_id)  # names the rule with the id as sent
        raise ContractError(f"invalid rollout id: the path's rollout segment decodes to {raw_id!r} but reads as "
                            f"{rollout_id!r}; a rollout id must match {ROLLOUT_ID_RULE} as sent (percent-decoded). "
                            "It is rejected, not rewritten: send the id unencoded.")


def parse_route(path: str, raw_path: bytes | bytearray | None = None) -> Route:
    """Classify a request path; raises ContractError for an invalid rollout id.

    ``path`` is the ASGI (percent-decoded) path, ``raw_path`` the ASGI raw path when the server gave one.
    """
    if not path.startswith(f"/{ROLLOUT_PREFIX}/"):
        return Route(Kind.BARE, path or "/")
    rest = path[len(ROLLOUT_PREFIX) + 2 :]
    rollout_id, _, tail = rest.partition("/")
    validate_rollout_id(rollout_id)
    check_raw_rollout_id(rollout_id, raw_path, 1)
    tail = "/" + tail
    if tail == f"/{CAPTURE_SEGMENT}" or tail.startswith(f"/{CAPTURE_SEGMENT}/"):
        return Route(Kind.CAPTURE, tail[len(CAPTURE_SEGMENT) + 1 :] or "/", rollout_id)
    return Route(Kind.EVAL, tail, rollout_id)


def is_control(path: str) -> bool:
    return path.startswith(CONTROL_PREFIXES)


def finish_rollout_id(path: str, raw_path: bytes | bytearray | None = None) -> str | None:
    """The rollout id of ``/rollouts/<id>/finish`` (validated: ContractError naming the rule), or None.

    Read from the raw path's segments when there is one, so ``/rollouts/a%2Fb/finish`` names the
    (refused) id ``a/b`` rather than being a different route.
    """
    segments = raw_segments(raw_path)
    if segments is None:
        segments = path.split("/")[1:]
    if segments and segments[-1] == "":  # a trailing slash
        segments = segments[:-1]
    if len(segments) != 3 or segments[0] != "rollouts" or segments[2] != "finish":
        return None
    rollout_id = segments[1]
    validate_rollout_id(rollout_id)
    decoded = path.rstrip("/").split("/")[1:]
    if len(decoded) != 3 or decoded[1] != rollout_id:  # the decoded path must say the same
        raise ContractError(f"invalid rollout id {rollout_id!r}: the path reads differently decoded ({path!r})")
    return rollout_id
