"""The SSE stream of ``/v1/chat/completions``, sequenced like vLLM's ``chat_completion_stream_generator``.

Order: nothing until the engine admits the request (while paused, vLLM holds it), then
one first chunk per choice, then one chunk per generated token per choice (round robin),
each choice's last token chunk carrying its finish reason, then the usage chunk
(``include_usage``) and ``[DONE]``.

* A token the parser holds back (markup, ``<think>``) still gets a chunk with
  ``delta: {}`` when token ids or log-probs are requested, so every id is delivered.
* Aborted (``POST /pause?mode=abort``): each unfinished choice ends with a terminal
  chunk ``delta: {}``, ``finish_reason: "abort"``, no further ids; a choice that had
  produced no token yet gets no chunk at all (vLLM skips empty outputs).
* ``stall``: after ``stall_after_chunks`` chunks the stream hangs until the client goes
  away, an abort ends it, or ``stall_seconds`` pass (then the connection is aborted).
* ``parallel_tool_calls: false`` drops deltas of every call after the first.
* An error vLLM's engine raises only after the stream started (``job.engine_error``) is
  sent as ``data: {"error": ...}`` followed by ``[DONE]``.

Weight versions are read as each token is generated (``PolicyEngine.at_token``): after a
``keep`` pause with an update, the rest of every choice comes from the new weights, and
the terminal chunk's ``weight_versions`` has one span per label.

Guarantees: for a completed stream, the concatenated ``token_ids`` and log-probs of a
choice equal the non-streaming ones of the same request (one generation feeds both).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from compose.engines.policy.agent import Generation
from compose.engines.policy.control import Flight
from compose.engines.policy.parsing import OutputParser
from compose.engines.policy.protocol import ResponseShaper, dumps, error_body
from compose.engines.policy.settings import PolicySettings
from schemas.errors import TokentrailError


class StalledStreamAborted(TokentrailError, RuntimeError):
    """Raised inside a stalled stream after ``stall_seconds``: the connection is aborted."""


class _Choice:
    """One choice's parser and what it has streamed so far."""

    def __init__(self, shaper: ResponseShaper, index: int, gen: Generation) -> None:
        job = shaper.job
        self.shaper, self.index, self.gen = shaper, index, gen
        self.parser = OutputParser(shaper.tok, tools_enabled=job.tools_enabled, tool_choice=job.tool_choice,
                                   forced=job.forced and job.params.forced_json)
        self.rebase(gen)
        self.sent_content = 0
        self.tools_streamed = False
        self.done = False

    def rebase(self, gen: Generation) -> None:
        """Continue with ``gen``: the same tokens as far as streamed (``PolicyEngine.at_token``)."""
        self.gen = gen
        # stop strings: vLLM truncates the streamed text exactly like the full message
        content = self.shaper.parsed(gen).content if isinstance(gen.stop_reason, str) else None
        self.budget = len(content or "") if content is not None else None

    def chunk(self, i: int) -> str | None:
        """The chunk for token ``i`` (None: vLLM sends nothing for it)."""
        shaper, job, gen = self.shaper, self.shaper.job, self.gen
        delta = self.parser.feed(gen.token_ids[i])
        if delta is not None and not job.include_reasoning:
            delta.pop("reasoning", None)
            delta = delta or None
        if delta is not None and self.budget is not None and isinstance(delta.get("content"), str):
            text = delta["content"][: max(self.budget - self.sent_content, 0)]
            self.sent_content += len(text)
            delta = {"content": text} if text else None
        if delta is not None and delta.get("tool_calls"):
            self.tools_streamed = True
            if not job.parallel_tool_calls:
                kept = [c for c in delta["tool_calls"] if c["index"] == 0]
                delta = {k: v for k, v in delta.items() if k != "tool_calls"}
                if kept:
                    delta["tool_calls"] = kept
        last = i == len(gen.token_ids) - 1
        finish = None
        if last:
            self.done = True
            reason = gen.finish_reason or "stop"
            finish = "tool_calls" if self.tools_streamed and not job.named and reason == "stop" else reason
        if delta is None:
            if finish is None and not shaper.send_logprobs and not (shaper.send_ids and not shaper.suppress):
                return None
            delta = {}
        return shaper.token_chunk(self.index, gen, i, i + 1, delta, finish)

    def abort_chunk(self, produced: int) -> str | None:
        """The terminal chunk of a choice aborted after ``produced`` tokens (None when it produced none)."""
        self.done = True
        if produced == 0:
            return None
        return self.shaper.token_chunk(self.index, self.gen.cut(produced), produced, produced, {}, "abort")


async def stream_chat(shaper: ResponseShaper, flight: Flight, settings: PolicySettings) -> AsyncIterator[str]:
    job = shaper.job
    if job.engine_error is not None:
        exc = job.engine_error
        yield f"data: {dumps(error_body(exc.message, exc.err_type, exc.status, exc.param))}\n\n"
        yield "data: [DONE]\n\n"
        return
    admitted = await flight.admit()
    for i in range(len(shaper.gens)):
        yield shaper.first_chunk(i)
    choices = [_Choice(shaper, i, gen) for i, gen in enumerate(shaper.gens)]
    stall = "stall" in job.faults
    sent = produced = t = 0
    while t < max(len(g.token_ids) for g in shaper.gens):
        if not admitted or not await flight.step(settings.decode_ms_per_token):
            break
        gens = shaper.engine.at_token(job, shaper.gens, t)
        if gens is not shaper.gens:  # the weight version changed: the rest comes from the new weights
            shaper.gens = gens
            for choice, gen in zip(choices, gens):
                if gen is not choice.gen:
                    choice.rebase(gen)
        for choice in choices:
            if t < len(choice.gen.token_ids):
                piece = choice.chunk(t)
                if piece is not None:
                    yield piece
                    sent += 1
        produced = t = t + 1
        if stall and sent >= settings.stall_after_chunks:
            if await flight.hang(settings.stall_seconds):
                break  # aborted while stalled
            raise StalledStreamAborted("stalled stream aborted (fault: stall)")
    if flight.aborted:
        for choice in choices:
            if not choice.done:
                piece = choice.abort_chunk(min(produced, len(choice.gen.token_ids)))
                if piece is not None:
                    yield piece
        shaper.gens = [c.gen.cut(produced) for c in choices]
    if job.include_usage:
        yield shaper.usage_chunk()
    yield "data: [DONE]\n\n"
