"""The one reader of the engine's chat-completions stream chunks (pure).

Both the capture (``producers.engine.chat_stream.ChatStreamAccumulator``, which assembles the
call's tokens) and the dialect translators (``common.ChunkReader``, which turn a stream
into Anthropic or Responses events) read a vLLM 0.33 chunk through ``read_chunk``, so
"what a chunk says" has one set of rules:

* a chunk is a JSON object, and carries at most the one choice of index 0 (token capture
  needs n=1; a second choice is refused, never silently dropped);
* text (``delta.content``) and reasoning (``delta.reasoning``, older servers
  ``delta.reasoning_content``) are strings or absent;
* a tool-call delta is an object with an integer ``index`` (default 0), and its
  ``function.name`` / ``function.arguments`` are strings or absent;
* a finish reason is a non-empty string (any: an engine-side ``abort`` is the capture's
  to record, a translator checks it against what its dialect can express);
* ``usage`` is cumulative: the last object seen is the usage;
* token fields (``prompt_token_ids``, ``token_ids``, ``logprobs.content``) are lists or
  absent; they are handed to the capture as-is and never into translated output.

Anything else raises ``DialectError`` (a ``ValueError``) naming it. Empty strings read as
absent. Sequencing rules (e.g. that Anthropic blocks cannot interleave tool calls) belong
to the readers that need them, not here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from producers.dialects.common import DialectError, check_finish_reason

__all__ = ["ChatChunk", "ChunkReader", "ToolDelta", "read_chunk"]


@dataclass(frozen=True, slots=True)
class ToolDelta:
    index: int
    id: str | None
    name: str | None
    arguments: str | None


class ChatChunk(NamedTuple):
    """What one chunk says (of choice 0); ``None`` / empty for what it does not say.

    A named tuple, not a frozen dataclass: one is made per streamed token, and a frozen dataclass's
    ``__init__`` sets each of its 13 fields through ``object.__setattr__``.
    """

    model: str | None = None
    created: int | None = None
    usage: dict[str, Any] | None = None
    prompt_token_ids: list[int] | None = None
    has_choice: bool = False
    text: str | None = None
    reasoning: str | None = None
    tools: Sequence[ToolDelta] = ()
    finish_reason: str | None = None
    stop_reason: Any = None
    token_ids: list[int] | None = None
    logprobs: list[Any] | None = None
    weight_versions: Any = None


def read_chunk(chunk: Any) -> ChatChunk:
    """Read one decoded engine chunk; DialectError when it breaks a rule of the module docstring.

    Runs once per streamed token, so it is written flat: no intermediate dicts, no generator, and the
    common token chunk (a text delta, its ids and log-probs) costs a handful of dict lookups.
    """
    if not isinstance(chunk, dict):
        raise DialectError("upstream stream chunk must be a JSON object")
    get = chunk.get
    model = get("model")
    created = get("created")
    usage = get("usage")
    prompt_ids = get("prompt_token_ids")
    if not (isinstance(model, str) and model):
        model = None
    if not isinstance(created, int):
        created = None
    if not (isinstance(usage, dict) and usage):
        usage = None
    if prompt_ids is not None and not isinstance(prompt_ids, list):
        _list(prompt_ids, "prompt_token_ids")
    choices = get("choices")
    if not choices:
        return ChatChunk(model, created, usage, prompt_ids)
    if not isinstance(choices, list) or len(choices) > 1 or not isinstance(choice := choices[0], dict) \
            or choice.get("index", 0) != 0:
        raise DialectError("upstream stream has a second choice (token capture needs n=1)")
    delta = choice.get("delta") or {}
    if not isinstance(delta, dict):
        raise DialectError("upstream stream choice's delta must be an object")
    finish = choice.get("finish_reason")
    if finish is not None and not isinstance(finish, str):
        raise DialectError(f"upstream finish_reason must be a string, got {finish!r}")
    text = delta.get("content")
    if text is not None and not isinstance(text, str):
        _text(text, "delta.content")
    reasoning = delta.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, str):
        _text(reasoning, "delta.reasoning")
    if not reasoning:  # vLLM 0.33 says "reasoning"; older servers "reasoning_content"; "" says nothing
        reasoning = _text(delta.get("reasoning_content"), "delta.reasoning_content")
    calls = delta.get("tool_calls")
    token_ids = choice.get("token_ids")
    if token_ids is not None and not isinstance(token_ids, list):
        _list(token_ids, "token_ids")
    logprobs = choice.get("logprobs")
    if isinstance(logprobs, dict):
        logprobs = logprobs.get("content")
        if logprobs is not None and not isinstance(logprobs, list):
            _list(logprobs, "logprobs.content")
    else:
        logprobs = None
    return ChatChunk(model, created, usage, prompt_ids, True, text or None, reasoning or None,
                     [_tool(call) for call in _list(calls, "delta.tool_calls")] if calls is not None else (),
                     finish or None, choice.get("stop_reason"), token_ids, logprobs, choice.get("weight_versions"))


def _text(value: Any, where: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise DialectError(f"upstream stream '{where}' must be a string, got {type(value).__name__}")
    return value or None


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise DialectError(f"upstream stream '{where}' must be a list, got {type(value).__name__}")
    return value


def _tool(call: Any) -> ToolDelta:
    if not isinstance(call, dict) or not isinstance(call.get("index", 0), int):
        raise DialectError("upstream tool-call delta must be an object with an integer index")
    function = call.get("function") or {}
    if not isinstance(function, dict):
        raise DialectError("upstream tool-call delta's function must be an object")
    return ToolDelta(index=call.get("index", 0), id=str(call["id"]) if call.get("id") else None,
                     name=_text(function.get("name"), "tool_calls[].function.name"),
                     arguments=_text(function.get("arguments"), "tool_calls[].function.arguments"))


@dataclass
class ChunkReader:
    """Reads vLLM chat SSE chunks (already JSON-decoded) into operations, in order:

    ``("reasoning", text)``, ``("text", text)``, ``("tool", index, id, name)`` when a tool
    call starts, ``("args", index, fragment)`` for its argument text. Concatenating the
    operations' text gives the non-streaming message (vLLM's streamed deltas concatenate to
    the full message). On top of ``read_chunk``'s rules: a finish reason must be one the
    dialects can express, a tool call's first delta names its id and function, and tool
    calls do not interleave (Anthropic blocks and Responses items are sequential).
    """

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    counted_ids: int = 0
    finish_reason: str | None = None
    stop_reason: Any = None
    created: int | None = None
    chunks: int = 0
    tools: dict[int, tuple[str, str]] = field(default_factory=dict)
    last_tool: int | None = None

    def read(self, chunk: dict, read: ChatChunk | None = None) -> list[tuple]:
        """The operations of one chunk; ``read`` is ``read_chunk(chunk)`` when the caller already made it."""
        c = read_chunk(chunk) if read is None else read
        self.chunks += 1
        if self.created is None:
            self.created = c.created
        if c.usage is not None:  # cumulative (continuous usage or the trailing usage chunk)
            if isinstance(c.usage.get("prompt_tokens"), int):
                self.prompt_tokens = c.usage["prompt_tokens"]
            if isinstance(c.usage.get("completion_tokens"), int):
                self.completion_tokens = c.usage["completion_tokens"]
        if self.prompt_tokens is None and c.prompt_token_ids is not None:
            self.prompt_tokens = len(c.prompt_token_ids)
        ops: list[tuple] = []
        if c.token_ids is not None:
            self.counted_ids += len(c.token_ids)
        if c.reasoning:
            ops.append(("reasoning", c.reasoning))
        if c.text:
            ops.append(("text", c.text))
        for call in c.tools:
            ops.extend(self._tool_delta(call))
        if c.finish_reason is not None:
            self.finish_reason = check_finish_reason(c.finish_reason)
            self.stop_reason = c.stop_reason
        return ops

    def _tool_delta(self, call: ToolDelta) -> list[tuple]:
        ops: list[tuple] = []
        if call.index not in self.tools:
            if not call.id or not call.name:
                raise DialectError(f"the first upstream delta of tool call {call.index} lacks id or function.name")
            self.tools[call.index] = (call.id, call.name)
            self.last_tool = call.index
            ops.append(("tool", call.index, call.id, call.name))
        elif call.index != self.last_tool:
            # Anthropic blocks and Responses items are sequential; vLLM's parsers never interleave.
            raise DialectError(f"upstream tool call {call.index} continued after tool call {self.last_tool} started")
        if call.arguments:
            ops.append(("args", call.index, call.arguments))
        return ops

    def usage(self) -> tuple[int, int]:
        """(input tokens, output tokens): the engine's usage, else the counted ids, else 0."""
        completion = self.completion_tokens if self.completion_tokens is not None else self.counted_ids
        return self.prompt_tokens or 0, completion

    def require_finished(self) -> str:
        if self.finish_reason is None:
            raise DialectError("the upstream stream ended without a finish_reason (interrupted): "
                               "there is no complete answer to close")
        return self.finish_reason
