"""The reference policy's side of a harness's sub-agent protocol: Codex's ``multi_agent_v1`` tools.

Codex offers ``spawn_agent`` (``message``: the child's task; optional in its schema, but Codex
refuses a spawn without it), ``wait_agent`` (``targets``: agent ids) and more; the child runs as its
own conversation on the same rollout URL, and the parent learns its answer from ``wait_agent``.
So that a scripted policy can drive it end to end (``#tool=spawn_agent``), three rules:

1. a ``spawn_agent`` call carries ``CHILD_TASK`` as its ``message``;
2. right after a tool result that names an ``agent_id`` (a spawn's answer), with ``wait_agent``
   offered: call ``wait_agent`` on that id (without the wait ``codex exec`` ends while the child
   still runs);
3. a user turn that is Codex's ``<subagent_notification>`` is answered, never re-delegated (it
   would reset the ``#tool-calls`` count of the script).

Guarantees: a pure function of the messages and the offered tool names; no rule applies to a
conversation that offers neither tool, so every other script is unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Set
from typing import Any

from compose.engines.policy import template

__all__ = ["CHILD_TASK", "SPAWN_TOOL", "WAIT_TOOL", "decide", "with_child_task"]

SPAWN_TOOL, WAIT_TOOL = "spawn_agent", "wait_agent"
CHILD_TASK = "Check the working directory with shell commands, then report."
_NOTIFICATION = "<subagent_notification>"


def decide(messages: list[Any], offered: Set[str | None]) -> list[tuple[str, str]] | None:
    """``[]`` (answer), ``[(wait_agent, arguments)]``, or None when no rule applies."""
    if SPAWN_TOOL not in offered and WAIT_TOOL not in offered:
        return None
    users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    if users and template.content_text(users[-1].get("content")).lstrip().startswith(_NOTIFICATION):
        return []
    last = messages[-1] if messages else None
    if WAIT_TOOL in offered and isinstance(last, dict) and last.get("role") == "tool":
        try:
            result = json.loads(template.content_text(last.get("content")))
        except ValueError:
            return None
        if isinstance(result, dict) and isinstance(result.get("agent_id"), str):
            return [(WAIT_TOOL, json.dumps({"targets": [result["agent_id"]], "timeout_ms": 60000}))]
    return None


def with_child_task(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """A spawn's arguments with the child's task filled in."""
    if name == SPAWN_TOOL and "message" not in args:
        return {**args, "message": CHILD_TASK}
    return args
