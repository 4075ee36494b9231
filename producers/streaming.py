"""Chat-completions SSE from the engine: assemble it for capture, pass it through for the client.

``ChatStreamAccumulator`` folds vLLM 0.33 chunks (``prompt_token_ids`` on the
first chunk, per-chunk ``token_ids`` and ``logprobs.content``, text, reasoning
and tool-call deltas, ``finish_reason``, a trailing usage chunk) into the same
shape as a non-streaming response, so both paths share one extraction.

``ChatStreamAdapter`` is the pass-through for chat clients: every chunk is
forwarded as soon as it arrives, minus the token fields, with the response id
that names the call; only ``[DONE]`` waits until the capture is durable.
"""

from __future__ import annotations

from typing import Any

import orjson

from producers.extract import CHOICE_TOKEN_FIELDS, TOP_LEVEL_TOKEN_FIELDS

DONE = b"data: [DONE]\n\n"


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

    def feed(self, chunk: dict[str, Any]) -> None:
        self.chunks += 1
        self.model = chunk.get("model") or self.model
        if chunk.get("prompt_token_ids") is not None:
            self.prompt_token_ids = list(chunk["prompt_token_ids"])
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            if choice.get("token_ids") is not None:
                self.token_ids = (self.token_ids or []) + list(choice["token_ids"])
            content = (choice.get("logprobs") or {}).get("content")
            if content is not None:
                self.logprobs = (self.logprobs or []) + list(content)
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.content.append(delta["content"])
            reasoning = delta.get("reasoning") or delta.get("reasoning_content")
            if reasoning:
                self.reasoning.append(reasoning)
            for call in delta.get("tool_calls") or ():
                slot = self.tool_calls.setdefault(call.get("index", 0), {"id": "", "type": "function",
                                                                        "function": {"name": "", "arguments": ""}})
                if call.get("id"):
                    slot["id"] = call["id"]
                function = call.get("function") or {}
                if function.get("name"):
                    slot["function"]["name"] += function["name"]
                if function.get("arguments"):
                    slot["function"]["arguments"] += function["arguments"]
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
                self.stop_reason = choice.get("stop_reason")
            if choice.get("weight_versions") is not None:
                self.weight_versions = choice["weight_versions"]

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


class ChatStreamAdapter:
    """Chat clients get the engine's chunks, minus token fields, under the call's response id."""

    def __init__(self, response_id: str, *, keep_logprobs: bool) -> None:
        self.response_id = response_id
        self.keep_logprobs = keep_logprobs

    def feed(self, chunk: dict[str, Any]) -> bytes:
        out = {k: v for k, v in chunk.items() if k not in TOP_LEVEL_TOKEN_FIELDS}
        out["id"] = self.response_id
        if "choices" in out:
            choices = []
            for choice in out["choices"]:
                clean = {k: v for k, v in choice.items() if k not in CHOICE_TOKEN_FIELDS and k != "weight_versions"}
                if not self.keep_logprobs and "logprobs" in clean:
                    clean["logprobs"] = None
                choices.append(clean)
            out["choices"] = choices
        return b"data: " + orjson.dumps(out) + b"\n\n"

    def finish(self) -> tuple[bytes, bytes]:
        return b"", DONE

    def error(self, status: int, message: str, kind: str = "capture_error") -> bytes:
        return b"data: " + orjson.dumps({"error": {"message": message, "type": kind, "code": status}}) + b"\n\n"
