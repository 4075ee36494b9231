"""Hashes that cross processes: token digests and lineage fingerprints.

Byte-compatible with NeMo Gym's training token-id capture (DIGEST_VERSION 1,
FINGERPRINT_VERSION 1) and pinned by golden vectors in
``tests/unit/schemas/test_hashing_golden.py``. Changing any byte layout here
means bumping the matching version constant: resolvers ignore fingerprints of a
different version, so a silent change would unlink every rollout in flight.

- ``compute_digest(ids)``: SHA-256 over the domain ``nemo-gym-tokens``, then (for a
  non-empty list) one version byte, the 8-byte big-endian count and each id as an
  8-byte big-endian unsigned integer.
- ``assistant_fingerprint(items)``: the lookup key of a request, the hash of its
  model-authored turns only (assistant messages, Responses ``function_call``
  items; reasoning is deliberately left out because harnesses need not echo it).
  ``""`` when there is no model-authored turn (the call is a root). ``FingerprintHasher`` gives
  the same hashes incrementally (a request's, then the request and its answer's).
- ``conversation_digest(items)``: the verifier, a hash of every item's role or
  type, content parts, tool calls and tool results.
- ``text_digest(text)``: SHA-256 over the domain ``tokentrail-opening-text``, a zero
  byte and the UTF-8 of the text with every whitespace run made one space and the
  ends stripped: how a sub-agent's opening message is matched to the prompt
  argument of the Agent/Task call that started it (capture and rebuild hash it
  alike; ours, not NeMo Gym's).
- ``canonicalize_tool_arguments(value)``: sorted-key compact JSON, so a harness
  that re-serialises tool arguments still matches; used for comparison only.

Chat, Anthropic and Responses shapes of the same conversation hash equally.
Every hashed field is tagged and length-delimited, so no concatenation of field
values can collide with another field boundary.
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
from array import array
from collections.abc import Iterable
from typing import Any

DIGEST_VERSION = 1
FINGERPRINT_VERSION = 1

_TOKENS_DOMAIN = b"nemo-gym-tokens"
_FINGERPRINT_DOMAIN = b"nemo-gym-lineage"
_CONTEXT_DOMAIN = b"nemo-gym-lineage-context"
_TEXT_DOMAIN = b"tokentrail-opening-text"
_TEXT_BLOCK_TYPES = frozenset({"", "text", "input_text", "output_text"})
_UINT64_MAX = (1 << 64) - 1
_LITTLE_ENDIAN = sys.byteorder == "little"
assert array("Q").itemsize == 8

# Ids packed per update (64 KiB, under glibc's smallest mmap threshold). A whole-sequence array beside the
# caller's own list of the ids (a rebuild's trajectory) doubled the heap they span, past glibc's trim threshold
# (twice the largest block freed so far, about one such list), so every call gave ~2 MiB back to the kernel and
# faulted it in again: ~480 page faults and ~0.8 ms a 128k-token rebuild (docs/perf/consumer.md). Slicing costs
# ~2 ns an id; the bytes hashed, and so the digest, are the same.
_PACK_IDS = 8192


def compute_digest(token_ids: Iterable[int]) -> str:
    """Hex SHA-256 of a token sequence; equal sequences, equal digests, in every process."""
    ids = token_ids if isinstance(token_ids, list) else list(token_ids)
    hasher = hashlib.sha256(_TOKENS_DOMAIN)
    if ids:
        hasher.update(struct.pack(">BQ", DIGEST_VERSION, len(ids)))
        for start in range(0, len(ids), _PACK_IDS):
            hasher.update(_packed(ids if len(ids) <= _PACK_IDS else ids[start:start + _PACK_IDS], ids))
    return hasher.hexdigest()


def _packed(chunk: list[int], ids: list[int]) -> array[int]:
    """``chunk`` (of ``ids``) as big-endian unsigned 64-bit integers, or ValueError naming the first bad id."""
    packed = array("Q")
    try:
        # C-speed packing that checks every id is an int in [0, 2**64); fromlist borrows each item where
        # the array constructor takes a reference per id (the one hash a rebuild pays per token).
        packed.fromlist(chunk)
    except (OverflowError, TypeError) as exc:
        bad = next((t for t in ids if not isinstance(t, int) or not 0 <= t <= _UINT64_MAX), None)
        raise ValueError(
            f"token ids must be integers in [0, 2**64); got {bad!r}: "
            "negative or non-integer ids are never valid token ids"
        ) from exc
    if _LITTLE_ENDIAN:
        packed.byteswap()  # the digest hashes big-endian ids
    return packed


def text_digest(text: str) -> str:
    """Hex SHA-256 of whitespace-normalised text; the same words, the same digest, in every process."""
    normalised = " ".join(text.split()).encode("utf-8", "surrogatepass")
    return hashlib.sha256(_TEXT_DOMAIN + b"\x00" + normalised).hexdigest()


def canonicalize_tool_arguments(value: Any) -> str:
    """Canonical text of a tool call's arguments, for comparison only.

    ``None`` → ``""``; a JSON string → re-emitted with sorted keys and compact
    separators; a string that is not JSON → stripped; any other value → its
    canonical JSON.
    """
    if value is None:
        return ""
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return value.strip()
        return _canonical_json(parsed)
    return _canonical_json(value)


def assistant_fingerprint(items: list[dict[str, Any]]) -> str:
    """Lookup key of a request: the hash of its model-authored turns, in order."""
    return FingerprintHasher(items).hexdigest()


class FingerprintHasher:
    """Incremental ``assistant_fingerprint``: ``extended(more)`` is ``assistant_fingerprint(items + more)``.

    A capture's continuation fingerprint (request items + the answer's items) then hashes only the
    answer: the request's items were hashed once, for its lookup key. Never mutated after ``__init__``.
    """

    __slots__ = ("_authored", "_h")

    def __init__(self, items: list[dict[str, Any]] | None = None) -> None:
        self._h = hashlib.sha256(_FINGERPRINT_DOMAIN)
        self._authored = _fingerprint_items(self._h, items)

    def hexdigest(self) -> str:
        return self._h.hexdigest() if self._authored else ""

    def extended(self, more: list[dict[str, Any]]) -> str:
        """``assistant_fingerprint(items + more)``, hashing ``more`` only."""
        hasher = self._h.copy()
        authored = self._authored + _fingerprint_items(hasher, more)
        return hasher.hexdigest() if authored else ""


def _fingerprint_items(hasher: Any, items: list[dict[str, Any]] | None) -> int:
    """Hash the model-authored turns of ``items`` into ``hasher``; how many there were."""
    authored = 0
    for item in items or []:
        _require_object(item)
        if not _is_model_authored(item):
            continue
        authored += 1
        for kind, payload in _content_parts(item.get("content")):
            _update(hasher, b"\x00", kind)
            _update(hasher, b"\x01", payload)
        for call_id, name, arguments in _tool_calls(item):
            _update(hasher, b"\x02", call_id)
            _update(hasher, b"\x03", name)
            _update(hasher, b"\x04", arguments)
    return authored


def conversation_digest(items: list[dict[str, Any]]) -> str:
    """Verifier of a request context: every item, model-authored or not."""
    return _ContextHasher().update_all(items).hexdigest()


def conversation_prefix_digests(items: list[dict[str, Any]]) -> list[str]:
    """``conversation_digest(items[:k])`` for every k in 0..len(items), in one pass."""
    hasher = _ContextHasher()
    digests = [hasher.hexdigest()]
    for item in items or []:
        hasher.update_item(item)
        digests.append(hasher.hexdigest())
    return digests


class _ContextHasher:
    """Incremental ``conversation_digest``; a prefix's digest costs one copy."""

    __slots__ = ("_h",)

    def __init__(self) -> None:
        self._h = hashlib.sha256(_CONTEXT_DOMAIN)

    def update_all(self, items: list[dict[str, Any]]) -> _ContextHasher:
        for item in items or []:
            self.update_item(item)
        return self

    def update_item(self, item: dict[str, Any]) -> None:
        _require_object(item)
        h = self._h
        _update(h, b"\x00", str(item.get("role") or item.get("type") or ""))
        for kind, payload in _content_parts(item.get("content")):
            _update(h, b"\x01", kind)
            _update(h, b"\x02", payload)
        for call_id, name, arguments in _tool_calls(item):
            _update(h, b"\x03", call_id)
            _update(h, b"\x04", name)
            _update(h, b"\x05", arguments)
        # Tool results are context: a summarised or truncated result is a
        # rewritten conversation, and must not verify.
        for call_id, output in _tool_results(item):
            _update(h, b"\x06", call_id)
            _update(h, b"\x07", output)

    def hexdigest(self) -> str:
        return self._h.copy().hexdigest()


def _require_object(item: Any) -> None:
    if not isinstance(item, dict):
        raise ValueError(
            f"request item must be a JSON object, got {type(item).__name__}: "
            "every message/input item of a chat, Anthropic or Responses request is an object"
        )


def _is_model_authored(item: dict[str, Any]) -> bool:
    # Chat and Anthropic: role assistant. Responses: roleless function_call items.
    # Reasoning items are left out on purpose: harnesses need not echo them.
    return item.get("role") == "assistant" or item.get("type") == "function_call"


def _content_parts(content: Any) -> list[tuple[str, str]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [("text", content)] if content else []
    if not isinstance(content, list):
        raise ValueError(
            f"message content must be a string or a list of blocks, got {type(content).__name__}"
        )
    parts: list[tuple[str, str]] = []
    for block in content:
        if isinstance(block, str):
            if block:
                parts.append(("text", block))
            continue
        if not isinstance(block, dict):
            raise ValueError(f"content block must be a string or an object, got {type(block).__name__}")
        kind = str(block.get("type") or "")
        if kind in ("tool_use", "tool_result"):
            continue  # hashed as tool calls / tool results
        text = block.get("text")
        if isinstance(text, str) and kind in _TEXT_BLOCK_TYPES:
            if text:
                parts.append(("text", text))
            continue
        if not kind:
            raise ValueError("content block has neither a type nor text: cannot hash it faithfully")
        parts.append((kind, _canonical_json(block)))
    return parts


def _tool_calls(item: dict[str, Any]) -> list[tuple[str, str, str]]:
    calls: list[tuple[str, str, str]] = []
    if item.get("type") == "function_call":
        calls.append(
            (
                str(item.get("call_id") or item.get("id") or ""),
                str(item.get("name", "")),
                canonicalize_tool_arguments(item.get("arguments")),
            )
        )
    content = item.get("content")
    if isinstance(content, list):
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_use":
                calls.append(
                    (
                        str(block.get("id") or ""),
                        str(block.get("name", "")),
                        canonicalize_tool_arguments(block.get("input")),
                    )
                )
    for call in item.get("tool_calls") or []:
        function = (call or {}).get("function") or {}
        calls.append(
            (
                str((call or {}).get("id") or ""),
                str(function.get("name", "")),
                canonicalize_tool_arguments(function.get("arguments")),
            )
        )
    return calls


def _tool_results(item: dict[str, Any]) -> list[tuple[str, str]]:
    results: list[tuple[str, str]] = []
    if item.get("type") == "function_call_output":
        output = item.get("output")
        results.append(
            (
                str(item.get("call_id") or item.get("id") or ""),
                output if isinstance(output, str) else _canonical_json(output),
            )
        )
    elif item.get("role") == "tool":
        content = item.get("content")
        results.append(
            (
                str(item.get("tool_call_id") or ""),
                content if isinstance(content, str) else _canonical_json(content),
            )
        )
    content = item.get("content")
    if isinstance(content, list):
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                inner = block.get("content")
                results.append(
                    (
                        str(block.get("tool_use_id") or block.get("id") or ""),
                        inner if isinstance(inner, str) else _canonical_json(inner),
                    )
                )
    return results


def _canonical_json(value: Any) -> str:
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"value is not canonical JSON ({exc}): {type(value).__name__}") from exc


def _update(hasher: Any, tag: bytes, value: str) -> None:
    encoded = value.encode("utf-8")
    hasher.update(tag + len(encoded).to_bytes(8, "big") + encoded)
