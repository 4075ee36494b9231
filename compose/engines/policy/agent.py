"""The scripted agent policy: which tokens the reference policy generates.

The *decision* (tool calls or a final answer) is scripted (``script.py``) so tests can
drive multi-turn tool use; every emitted token's log-prob is nevertheless the model
table's log-prob of that token in its actual context (``model.py``). A tool call is

    <tool_call> + encode('{"name": "<tool>", "arguments": <args>}') + </tool_call>

once per decided call, then ``<|im_end|>``. A forced tool choice (``"required"`` or a
named tool) with ``forced_tool_format="json"`` emits vLLM's grammar-constrained JSON
instead (``script.forced_json_text``), then ``<|im_end|>``. Otherwise a final answer: a
sampled sentence of 8-40 tokens (``#answer-words=N``: N + 2), then ``<|im_end|>``. With reasoning on, ``<think>`` +
sampled words + ``</think>`` come first. The ``repetition`` fault makes the answer
repeat a two-word phrase until vLLM's repetition detection would stop it
(finish_reason ``"repetition"``).

Guarantees: free text is drawn only from whole pre-token pieces (a capitalised word,
then space-prefixed words, then one ``.``), so ``encode(decode(ids)) == ids`` for the
generated ids, unless the ``drift`` fault asks for one non-canonical (byte-split) word.
Generation stops at ``<|im_end|>`` (unless ``ignore_eos``), at a stop token id or stop
string, or at ``max_tokens`` (finish reason ``length``).

Weight versions are per token, as vLLM stamps every engine step with its current label:
``GenerationParams.version_changes`` lists ``(token index, table version, label)`` where a
weight update (during a ``keep`` pause) took effect, and each token is sampled and scored
with the table of the version current at its index. A run is a deterministic function of
its schedule, so re-running with a change appended at index ``t`` reproduces tokens
``0..t-1`` exactly and continues under the new weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from compose.engines.policy import template
from compose.engines.policy import tokenizer as tk
from compose.engines.policy.model import PolicyModel
from compose.engines.policy.script import (  # noqa: F401  (re-exported: the decision API lives in script.py)
    ToolDecision,
    answer_words,
    build_arguments,
    decide_tool_call,
    decide_tool_calls,
    directive_values,
    forced_json_text,
    tool_results_since_last_user,
)

_REPEATS = 6  # phrase repetitions after which the repetition fault stops the generation


@dataclass
class GenerationParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    reasoning: bool = False
    drift: bool = False
    repetition: bool = False
    forced_json: bool = False  # a forced tool choice writes vLLM's constrained JSON, not markup
    weight_version: int = 0  # the model-table version of the first token (control.version_key of the label)
    weight_label: str = "default"
    # (first token index, table version, label) of each later weight update, ascending indexes
    version_changes: tuple[tuple[int, int, str], ...] = ()

    def at(self, index: int) -> tuple[int, str]:
        """(table version, label) current when token ``index`` is generated."""
        current = (self.weight_version, self.weight_label)
        for start, version, label in self.version_changes:
            if start > index:
                break
            current = (version, label)
        return current


@dataclass
class Generation:
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)  # table row of each position (top_logprobs)
    finish_reason: str | None = None  # "stop" | "length" | "repetition" | "abort"
    stop_reason: str | int | None = None
    weight_version: int = 0  # the model-table version at the first token (prompt log-probs use it)
    weight_label: str = "default"
    versions: list[int] = field(default_factory=list)  # table version of each position
    labels: list[str] = field(default_factory=list)  # weight version label of each position (weight_versions)

    def cut(self, n: int) -> Generation:
        """The first ``n`` tokens, as an abort leaves them (``n`` at least the length: unchanged)."""
        if n >= len(self.token_ids):
            return self
        return replace(self, token_ids=self.token_ids[:n], logprobs=self.logprobs[:n], rows=self.rows[:n],
                       versions=self.versions[:n], labels=self.labels[:n], finish_reason="abort", stop_reason=None)


class _Writer:
    """Appends tokens with their table log-probs and enforces the stopping rules."""

    def __init__(self, model: PolicyModel, tok: tk.Tokenizer, prompt_ids: list[int],
                 params: GenerationParams, rng: np.random.Generator) -> None:
        self.model, self.tok, self.params, self.rng = model, tok, params, rng
        self.tables: dict[int, np.ndarray] = {}
        self.ctx = model.context(prompt_ids)
        self.out = Generation(weight_version=params.weight_version, weight_label=params.weight_label)
        self.drift_pending = params.drift
        self.text = ""
        self.done = params.max_tokens <= 0
        if self.done:
            self.out.finish_reason = "length"

    @property
    def version(self) -> int:
        """The table version of the next position."""
        return self.params.at(len(self.out.token_ids))[0]

    def _row(self) -> int:
        a, b, c = self.ctx
        return self.model.row(a, b, c, self.version)

    def emit(self, token: int, row: int | None = None) -> bool:
        if self.done:
            return False
        out = self.out
        version, label = self.params.at(len(out.token_ids))
        row = self._row() if row is None else row
        out.token_ids.append(token)
        table = self.tables.get(version)
        if table is None:
            table = self.tables[version] = self.model.table(version)
        out.logprobs.append(float(table[row, token]))
        out.rows.append(row)
        out.versions.append(version)
        out.labels.append(label)
        self.ctx = (self.ctx[1], self.ctx[2], token)
        if token == tk.IM_END and not self.params.ignore_eos:
            self._finish("stop", None)
        elif token in self.params.stop_token_ids:
            self._finish("stop", token)
        elif len(out.token_ids) >= self.params.max_tokens:
            self._finish("length", None)
        return not self.done

    def emit_piece(self, token: int, row: int | None = None, check_stop: bool = False) -> bool:
        """Emit a text token; the drift fault splits the first multi-byte piece into bytes."""
        data = self.tok.token_bytes(token)
        if self.drift_pending and token >= tk.PIECE_OFFSET and len(data) > 1:
            self.drift_pending = False
            alive = all(self.emit(tk.BYTE_OFFSET + b) for b in data)
        else:
            alive = self.emit(token, row)
        if alive and check_stop and self.params.stop:
            # vLLM checks stop strings against the decoded output text
            self.text += self.tok.token_str(token)
            hit = next((s for s in self.params.stop if s in self.text), None)
            if hit is not None:
                self._finish("stop", hit)
                return False
        return alive

    def sample(self, allowed: np.ndarray, key: str, check_stop: bool = False) -> bool:
        if self.done:
            return False
        row = self._row()
        p = self.params
        token = self.model.draw(self.rng, row, self.version, allowed, key,
                                p.temperature, p.top_p, p.top_k)
        return self.emit_piece(token, row, check_stop)

    def _finish(self, reason: str, stop_reason: str | int | None) -> None:
        self.done = True
        self.out.finish_reason = reason
        self.out.stop_reason = stop_reason


class AgentPolicy:
    """Turns a rendered prompt plus the request's conversation into a Generation."""

    def __init__(self, model: PolicyModel, tok: tk.Tokenizer, default_tool_calls: int = 2):
        self.model, self.tok, self.default_tool_calls = model, tok, default_tool_calls
        self.words = np.asarray(tok.spaced_word_ids, dtype=np.int64)
        self.starts = np.asarray(tok.sentence_start_ids, dtype=np.int64)
        self.period = tok.piece_id(".")

    def generate(self, prompt_ids: list[int], messages: list[Any], tools: list[Any] | None,
                 tool_choice: Any, params: GenerationParams, rng: np.random.Generator) -> Generation:
        w = _Writer(self.model, self.tok, prompt_ids, params, rng)
        calls = decide_tool_calls(messages, tools, tool_choice, self.default_tool_calls, rng)
        if params.reasoning and w.emit(tk.THINK):
            for _ in range(int(rng.integers(4, 17))):
                if not w.sample(self.words, "words"):
                    break
            w.emit(tk.THINK_END)
        forced = tool_choice == "required" or isinstance(tool_choice, dict)
        if calls and forced and params.forced_json:
            for token in self.tok.encode(forced_json_text(calls, tool_choice)):
                if not w.emit_piece(token):
                    break
        elif calls:
            for call in calls:
                if not w.emit(tk.TOOL_CALL):
                    break
                for token in self.tok.encode(template.tool_call_body(call.name, call.arguments)):
                    if not w.emit_piece(token):
                        break
                w.emit(tk.TOOL_CALL_END)
        elif params.repetition:
            self._repeat(w)
        elif w.sample(self.starts, "starts", check_stop=True):
            words = answer_words(messages)
            for _ in range(words if words is not None else int(rng.integers(6, 38))):
                if not w.sample(self.words, "words", check_stop=True):
                    break
            if self.period is not None:
                w.emit_piece(self.period, check_stop=True)
        if params.ignore_eos:
            while w.sample(self.words, "words", check_stop=not calls):
                pass
        else:
            w.emit(tk.IM_END)
        if w.out.finish_reason is None:  # cannot happen: every path ends at a stop rule
            w.out.finish_reason = "stop"
        return w.out

    def _repeat(self, w: _Writer) -> None:
        """A sentence start, then a two-word phrase repeated until the repetition fault stops it."""
        if not w.sample(self.starts, "starts", check_stop=True):
            return
        phrase: list[int] = []
        for _ in range(2):
            if not w.sample(self.words, "words", check_stop=True):
                return
            phrase.append(w.out.token_ids[-1])
        for _ in range(_REPEATS - 1):
            for token in phrase:
                if not w.emit_piece(token, check_stop=True):
                    return
        w._finish("repetition", None)
