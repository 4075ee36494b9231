"""A call's identity signals, read at capture time (pure: no framework, no I/O).

Three facts feed the rebuild's trace classification (``consumers.rebuild.identity``):

* ``trace_declared``: the harness's own declaration, the ``x-tokentrail-trace`` request
  header (``TRACE_HEADER``). Grammar (exact, case-sensitive, ``TRACE_GRAMMAR``)::

      main | compaction | subagent[:LABEL] | side[:LABEL] | other[:LABEL]
      LABEL = 1..200 characters of [A-Za-z0-9_.:/@ -]

  so ``subagent:code-reviewer``, ``side:title`` and ``other:a:b`` (label ``a:b``: only the
  first ``:`` separates) are valid; ``Main``, ``main:x``, ``subagent:`` and a label with any
  other character (a tab, a comma, non-ASCII) are not. ``trace_problem`` says why a value is
  malformed; admission (``producers.http.admission.trace_refusal``) refuses such a request before
  anything is recorded or forwarded, so a value that reaches ``CallFacts`` is valid and kept
  verbatim. The header is tokentrail's, never the engine's: it is not in
  ``producers.http.replies.FORWARDED_REQUEST_HEADERS``.
* ``agent_name``: the agent a harness names in its own headers (``AGENT_HEADERS``). These
  headers are the harness's, not ours: one that is absent, empty or does not parse gives ``""``,
  never an error.
* ``opening_text_digests``: ``schemas.hashing.text_digest`` of each text part of the request's
  opening user turn, in order, at most ``MAX_OPENING_DIGESTS``; ``[]`` without a user message.
  The opening user turn is the first ``role == "user"`` message and the user messages that
  follow it before any other conversation item (system and developer messages are passed over):
  Claude Code puts a sub-agent's prompt in the second text block of its first user message,
  after a ``<system-reminder>``; Codex puts it in the second user message, after the
  ``<environment_context>`` one.

  Every call of a rollout repeats its opening turn, and a group of rollouts of one task shares it, so
  the digests are memoised (``_OpeningDigestMemo``): normalising a 40 KB prompt's whitespace costs
  ~0.3 ms, its SHA-256 ~0.03 ms. The memo is keyed by the SHA-256 of the raw text (never by a guess:
  two texts share an entry only if they share that hash), bounded in entries, and returns exactly
  what ``text_digest`` returns.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from schemas.hashing import text_digest

__all__ = ["AGENT_HEADERS", "MAX_OPENING_DIGESTS", "TRACE_GRAMMAR", "TRACE_HEADER", "agent_name",
           "opening_text_digests", "opening_user_items", "trace_problem"]

TRACE_HEADER = "x-tokentrail-trace"
TRACE_GRAMMAR = ("main | compaction | subagent[:LABEL] | side[:LABEL] | other[:LABEL], "
                 "LABEL = 1..200 characters of [A-Za-z0-9_.:/@ -]")
_TRACE = re.compile(r"(?:main|compaction|(?:subagent|side|other)(?::[A-Za-z0-9_.:/@ \-]{1,200})?)")
_SHOWN = 80  # characters of a refused value quoted back (the rest is the harness's own)

MAX_OPENING_DIGESTS = 64
_TEXT_PARTS = ("text", "input_text")
_PASSED_OVER = ("system", "developer")  # instructions between user messages; not the conversation

# The harness headers that name the agent a call is made for, in order (first that names one wins),
# with how each is read. What the pinned CLIs (compose/harnesses/claude_code, compose/harnesses/codex) were seen to send:
# * Claude Code: ``x-claude-code-agent-id`` (the sub-agent's agentId, as in its Agent tool_result)
#   on a sub-agent's calls only; nothing names the agent type, and the main loop sends no such header.
# * Codex: ``x-codex-turn-metadata``, a JSON object on every call. Its ``agent_name`` is the agent's
#   path: "/root" for the main agent and, in 0.171, for a spawned one too (the binary's multi-agent
#   prompt addresses children as "/root/<name>", read as a name; not yet seen on the wire);
#   ``thread_source`` "subagent" and ``subagent_kind`` ("thread_spawn") mark a spawned agent's calls
#   only. ``x-openai-subagent`` ("collab_spawn") is sent on a spawned agent's calls only.
AGENT_HEADERS: tuple[tuple[str, str], ...] = (
    ("x-claude-code-agent-id", "plain"),
    ("x-codex-turn-metadata", "codex_turn_metadata"),
    ("x-openai-subagent", "plain"),
)
_CODEX_ROOT = "/root"  # the main agent's path in Codex's agent tree: names no sub-agent
_NOT_AGENTS = frozenset({"compact"})  # Codex's compaction session source: a compaction, not an agent
_AGENT_MAX = 200


def trace_problem(value: str) -> str | None:
    """None when ``value`` is in the trace grammar; else the 400 message naming header, value and grammar."""
    if _TRACE.fullmatch(value):
        return None
    shown = value if len(value) <= _SHOWN else value[:_SHOWN] + "..."
    return (f"header {TRACE_HEADER} has the value {shown!r}, which is not a trace declaration: send one of "
            f"{TRACE_GRAMMAR} (e.g. 'subagent:reviewer'), or leave the header out; nothing was recorded or "
            "forwarded")


def agent_name(headers: Mapping[str, str]) -> str:
    """The agent the harness names in ``AGENT_HEADERS`` (lower-cased header names); ``""`` when none does.

    Only a header that marks a sub-agent's call gives a name, so a main agent's call is always
    ``""`` (the rebuild reads any name as "a sub-agent"). Never raises: a value that is empty,
    not printable, over 200 characters or (for the JSON header) not a JSON object names nobody.
    """
    for header, how in AGENT_HEADERS:
        value = headers.get(header)
        if not value:
            continue
        name = _codex_agent(value) if how == "codex_turn_metadata" else _plain(value)
        if name and name not in _NOT_AGENTS:
            return name
    return ""


def _plain(value: Any) -> str:
    if not isinstance(value, str):
        return ""
    name = value.strip()
    return name if 0 < len(name) <= _AGENT_MAX and name.isprintable() else ""


def _codex_agent(value: str) -> str:
    """A sub-agent named by Codex's turn metadata: its path below /root, else its ``subagent_kind``."""
    try:
        data = json.loads(value)
    except (ValueError, RecursionError):
        return ""  # the harness's header, not ours: unreadable means it names nobody
    if not isinstance(data, dict):
        return ""
    path = _plain(data.get("agent_name"))
    if path.startswith(_CODEX_ROOT + "/"):
        return path
    kind = _plain(data.get("subagent_kind"))
    if kind:
        return kind
    return "subagent" if data.get("thread_source") == "subagent" else ""


def opening_user_items(body: Mapping[str, Any]) -> list[Any]:
    """The conversation items of a request body as the harness sent it, whatever its dialect.

    Chat and Anthropic Messages carry ``messages``; Responses carries ``input`` (a string is one
    user message). Read from the harness's own body, not the translated chat body: the
    translators join a message's text parts into one string (``producers.dialects.common.join_text``),
    which would fold a ``<system-reminder>`` block and a sub-agent's prompt into one digest.
    """
    messages = body.get("messages")
    if isinstance(messages, list):
        return messages
    given = body.get("input")
    if isinstance(given, str):
        return [{"role": "user", "content": given}]
    return given if isinstance(given, list) else []


def opening_text_digests(items: list[Any]) -> list[str]:
    """``text_digest`` of each text part of the opening user turn, in order (at most 64).

    A message's content is a string (one part) or a list of parts; a text part has ``type``
    "text" or "input_text" (or none) and a string ``text``; other parts are skipped.
    """
    digests: list[str] = []
    opened = False
    for item in items:
        role = item.get("role") if isinstance(item, dict) else None
        if role in _PASSED_OVER:
            continue
        if role != "user" or item.get("type", "message") != "message":
            if opened:
                break  # the opening turn ends at the first assistant message or tool item
            continue
        opened = True
        for text in _texts(item.get("content")):
            digests.append(_MEMO.digest(text))
            if len(digests) == MAX_OPENING_DIGESTS:
                return digests
    return digests


class _OpeningDigestMemo:
    """``text_digest(text)`` of the ``size`` texts last asked for, keyed by the SHA-256 of their UTF-8.

    Safe to call from several threads at once (a large request body is described in a worker thread,
    ``producers.call.large_bodies``) without a lock: each OrderedDict operation is atomic under the GIL,
    and the two another thread can undo in between (an entry evicted before it is moved to the end, the
    last entry popped twice) are tolerated. A race costs at most a recomputation, never a wrong digest.
    """

    __slots__ = ("size", "_digests")

    def __init__(self, size: int) -> None:
        self.size = size
        self._digests: OrderedDict[bytes, str] = OrderedDict()

    def digest(self, text: str) -> str:
        key = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
        found = self._digests.get(key)
        if found is not None:
            try:
                self._digests.move_to_end(key)
            except KeyError:  # evicted by another thread meanwhile; the digest found is still its digest
                pass
            return found
        found = self._digests[key] = text_digest(text)
        if len(self._digests) > self.size:
            try:
                self._digests.popitem(last=False)
            except KeyError:  # emptied by other threads meanwhile
                pass
        return found


# ~100 bytes an entry; 4,096 covers the opening turns of thousands of rollouts in flight.
_MEMO = _OpeningDigestMemo(4096)


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    return [part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)
            and part.get("type", "text") in _TEXT_PARTS] if isinstance(content, list) else []
