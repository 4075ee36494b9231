"""A running vLLM server's dev-mode admin routes: pause, resume, the weight-version label.

Every route here exists only when the server runs with ``VLLM_SERVER_DEV_MODE=1`` (a 404 says
so). Each call is one request on its own connection and returns the engine's JSON answer, or
raises `WeightPushError` (a ``TransportError``) naming the route, the engine and its answer.
``push_weights`` (``weights``) and ``tokentrail versions announce --engine`` use them; httpx only.
"""

from __future__ import annotations

from typing import Any, Literal

import httpx

from schemas.errors import TransportError

__all__ = ["UPDATE_WEIGHT_VERSION_PATH", "PauseMode", "WeightPushError", "call", "is_paused", "pause", "resume",
           "set_version", "weight_info"]

PauseMode = Literal["abort", "wait", "keep"]
UPDATE_WEIGHT_VERSION_PATH = "/update_weight_version"


class WeightPushError(TransportError):
    """The engine refused a weight operation or could not be reached; the message names the route and its answer."""


def call(method: str, url: str, route: str, *, timeout: float = 60.0, api_key: str | None = None, **kwargs: Any) -> Any:
    """One request to a dev-mode route; its JSON answer, or `WeightPushError` naming the route and the answer."""
    # One connection per call: the server closes a connection after a 500, and a pooled client
    # would then see "connection reset" on its next request instead of the engine's answer.
    try:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        r = httpx.request(method, f"{url.rstrip('/')}{route}", timeout=timeout, headers=headers, **kwargs)
    except httpx.HTTPError as exc:
        raise WeightPushError(f"{method} {route} on {url} failed: {exc!r}; is the engine running?") from exc
    if r.status_code == 404:
        raise WeightPushError(f"{method} {route} on {url}: 404; the weight routes exist only when vLLM runs "
                              "with VLLM_SERVER_DEV_MODE=1 (set it in the engine's environment)")
    if r.status_code != 200:
        try:
            detail = r.json().get("error", r.json())
            detail = detail.get("message", detail) if isinstance(detail, dict) else detail
        except (ValueError, AttributeError):
            detail = r.text
        raise WeightPushError(f"{method} {route} on {url}: engine answered {r.status_code}: {str(detail)[:800]}")
    return r.json() if r.content else None


def pause(url: str, mode: PauseMode = "wait", *, timeout: float = 300.0) -> None:
    """Stop scheduling: ``abort`` ends in-flight requests, ``wait`` returns once they finish, ``keep`` freezes them."""
    if mode not in ("abort", "wait", "keep"):
        raise WeightPushError(f"pause mode must be 'abort', 'wait' or 'keep', got {mode!r}")
    call("POST", url, "/pause", params={"mode": mode}, timeout=timeout)


def resume(url: str) -> None:
    """Schedule again; requests that queued while paused start now."""
    call("POST", url, "/resume")


def is_paused(url: str) -> bool:
    return bool(call("GET", url, "/is_paused")["is_paused"])


def set_version(url: str, label: str, *, api_key: str | None = None, timeout: float = 60.0) -> None:
    """Set the label ``weight_info`` reports (``POST /update_weight_version``); changes no weights."""
    if not isinstance(label, str) or not label:
        raise WeightPushError(f"version_label must be a non-empty string, got {label!r}")
    try:
        call("POST", url, UPDATE_WEIGHT_VERSION_PATH, json={"new_version": label}, api_key=api_key, timeout=timeout)
    except WeightPushError as exc:
        raise WeightPushError(f"the engine did not take the label {label!r}: {exc}") from exc


def weight_info(url: str) -> str:
    """The weight version label the engine reports (``"default"`` until one is set)."""
    return str(call("GET", url, "/weight_info")["weight_version"])
