"""Chat-completions SSE from the engine, assembled for capture.

``ChatStreamAccumulator`` folds vLLM 0.33 chunks (``prompt_token_ids`` on the
first chunk, per-chunk ``token_ids`` and ``logprobs.content``, text, reasoning
and tool-call deltas, ``finish_reason``, a trailing usage chunk) into the same
shape as a non-streaming response, so both paths share one extraction. Chunks
are read by ``producers.dialects.chat_chunks.read_chunk``, the reader the dialect
translators use too. (What chat clients receive is ``producers.dialects.chat``.)
"""

from __future__ import annotations

from typing import Any

from producers.dialects.chat_chunks import ChatChunk, read_chunk
from producers.engine.continuation import check_prompt, join_weight_versions

__all__ = ["ChatStreamAccumulator"]


class ChatStreamAccumulator:
    def __init__(self) -> None:
        self.prompt_token_ids: list[int] | None = None
        self.token_ids: list[int] | None = None
        self.logprobs: list[dict[str, Any]] | None = None
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.stop_reason: Any = None
        self.usage: dict[str, Any] | None = None
        self.model = ""
        self.weight_versions: Any = None
        self.chunks = 0
        # A continued call (producers.engine.continuation): parts after the first must report this prompt.
        self.parts = 1
        self.expected_prompt: list[int] | None = None
        self.part_prompt_error = ""
        self._prior_versions: Any = None
        self._prior_completion = 0

    def feed(self, chunk: dict[str, Any]) -> ChatChunk:
        """Fold one engine chunk in and return what it says (``read_chunk``'s reading, for the dialect's
        translator: one read per chunk); DialectError (a ValueError) for a chunk ``read_chunk`` refuses."""
        c = read_chunk(chunk)
        self.chunks += 1
        self.model = c.model or self.model
        if c.prompt_token_ids is not None:
            if self.expected_prompt is None:
                self.prompt_token_ids = list(c.prompt_token_ids)
            elif not self.part_prompt_error:
                self.part_prompt_error = check_prompt(list(c.prompt_token_ids), self.expected_prompt)
        if c.usage is not None:
            self.usage = c.usage
            if self._prior_completion and isinstance(c.usage.get("completion_tokens"), int):
                done = c.usage["completion_tokens"] + self._prior_completion
                prompt = len(self.prompt_token_ids) if self.prompt_token_ids is not None else None
                self.usage = {**c.usage, "completion_tokens": done, "prompt_tokens": prompt,
                              "total_tokens": (prompt or 0) + done}
        if not c.has_choice:
            return c
        # Extended in place: a stream's tokens arrive one chunk at a time, and a copy per chunk made the
        # assembly quadratic in the generation (~1.3e5 element copies at 512 tokens).
        if c.token_ids is not None:
            if self.token_ids is None:
                self.token_ids = []
            self.token_ids.extend(c.token_ids)
        if c.logprobs is not None:
            if self.logprobs is None:
                self.logprobs = []
            self.logprobs.extend(c.logprobs)
        if c.text:
            self.content.append(c.text)
        if c.reasoning:
            self.reasoning.append(c.reasoning)
        for call in c.tools:
            slot = self.tool_calls.setdefault(call.index, {"id": "", "type": "function",
                                                           "function": {"name": "", "arguments": ""}})
            if call.id:
                slot["id"] = call.id
            if call.name:
                slot["function"]["name"] += call.name
            if call.arguments:
                slot["function"]["arguments"] += call.arguments
        if c.finish_reason:
            self.finish_reason = c.finish_reason
            self.stop_reason = c.stop_reason
        if c.weight_versions is not None:
            if self.parts == 1:
                self.weight_versions = c.weight_versions
            else:
                offset = self._prior_completion
                self.weight_versions = join_weight_versions(self._prior_versions, c.weight_versions, offset)
        return c

    def begin_part(self) -> list[int]:
        """An aborted part ended; the next part continues it. Returns the prompt the next part must report."""
        expected = list(self.prompt_token_ids or []) + list(self.token_ids or [])
        self.parts += 1
        self.expected_prompt = expected
        self.part_prompt_error = ""
        self._prior_versions = self.weight_versions
        self._prior_completion = len(self.token_ids or [])
        self.weight_versions = None
        self.finish_reason = None
        self.stop_reason = None
        return expected

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def response(self) -> dict[str, Any]:
        """The equivalent non-streaming response (token fields included, as the engine sent them)."""
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.content) or None,
                                   "reasoning": "".join(self.reasoning) or None}
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": self.finish_reason,
                                  "stop_reason": self.stop_reason,
                                  "logprobs": {"content": self.logprobs} if self.logprobs is not None else None}
        if self.token_ids is not None:
            choice["token_ids"] = self.token_ids
        if self.weight_versions is not None:
            choice["weight_versions"] = self.weight_versions
        out: dict[str, Any] = {"object": "chat.completion", "model": self.model, "choices": [choice],
                               "usage": self.usage}
        if self.prompt_token_ids is not None:
            out["prompt_token_ids"] = self.prompt_token_ids
        return out
