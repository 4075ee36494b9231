"""The reference policy's next-token distribution: deterministic, context-dependent, with
real log-probs.

A table of ``rows x vocab_size`` log-softmax values (float32, as vLLM's) is drawn once per
(seed, weight version) from a seeded numpy generator. The distribution at a position is
the table row selected by a hash of the previous three token ids and the weight version:

    logprob(token | context) = table[row(context[-3:], version)][token]

Guarantees:

* Generation and scoring use the same table lookup, so a log-prob reported for a
  generated token is bit-identical (``==``) to ``score(prompt + generated)`` at that
  position. Python floats round-trip exactly through JSON, so this survives the wire.
* Reported log-probs are raw (before temperature / top-p / top-k), like vLLM's default
  ``--logprobs-mode raw_logprobs``. ``reported`` gives the other modes: ``raw_logits``
  (the table shifted by ``LOGIT_SHIFT``: unnormalised, as a model's output is),
  ``processed_logits`` (those after temperature, top-k and top-p; removed tokens -inf)
  and ``processed_logprobs`` (their log-softmax).
* Changing the weight version changes both the table and the row hash.
* Sampling uses only the generator passed in, so a request with the same seed (or the
  same prompt, when no seed is given) produces the same tokens.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import numpy.typing as npt

_M32 = 0xFFFFFFFF
_K_A, _K_B, _K_C, _K_V, _K_0 = 0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D, 0x27D4EB2F, 0x165667B1
_K_MIX1, _K_MIX2 = 0x2C1B3C6D, 0x297A2D39
_TOP_N = 20  # vLLM's default --max-logprobs
LOGIT_SHIFT = 7.25  # raw logits = raw log-probs + this (any per-row constant keeps the softmax)
LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs", "raw_logits", "processed_logits")
_TABLES: dict[tuple[int, int, int, int, float], np.ndarray] = {}
_TABLES_LOCK = threading.Lock()
_TABLES_LIMIT = 4
_DIST_CACHE_LIMIT = 8192


def _table(seed: int, version: int, rows: int, vocab: int, scale: float) -> np.ndarray:
    key = (seed, version, rows, vocab, scale)
    with _TABLES_LOCK:
        table = _TABLES.get(key)
        if table is None:
            rng = np.random.default_rng([seed & _M32, version & _M32, 0x7A11])
            logits = rng.standard_normal((rows, vocab)) * scale
            logits -= logits.max(axis=1, keepdims=True)
            # float32, as vLLM computes log-probs: the values it reports are exactly float32 values
            # (what the wire carries in 4 bytes, schemas.wire_kinds.LogProbs).
            table = (logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))).astype(np.float32)
            table.setflags(write=False)
            if len(_TABLES) >= _TABLES_LIMIT:
                _TABLES.pop(next(iter(_TABLES)))
            _TABLES[key] = table
        return table


class PolicyModel:
    """Table-driven log-probs plus the samplers that draw from restricted token sets."""

    def __init__(self, vocab_size: int, *, seed: int = 0, rows: int = 1024, scale: float = 2.5):
        self.vocab_size = vocab_size
        self.pad = vocab_size  # context id for positions before the first token
        self.seed = seed
        self.rows = rows
        self.scale = scale
        self._dist_cache: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self._top_cache: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        self._processed_cache: dict[tuple, np.ndarray] = {}

    def table(self, version: int) -> np.ndarray:
        return _table(self.seed, version, self.rows, self.vocab_size, self.scale)

    # -- rows -----------------------------------------------------------------------

    def row(self, a: int, b: int, c: int, version: int) -> int:
        """Row for context (a, b, c) = the three previous ids, oldest first."""
        h = (a * _K_A + b * _K_B + c * _K_C + (version & _M32) * _K_V + _K_0) & _M32
        h ^= h >> 15
        h = (h * _K_MIX1) & _M32
        h ^= h >> 12
        h = (h * _K_MIX2) & _M32
        h ^= h >> 15
        return h % self.rows

    def rows_for(self, ids: Sequence[int], start: int, version: int) -> np.ndarray:
        """Rows of positions ``start .. len(ids)-1`` (vectorised ``row``; same integers)."""
        arr = np.asarray(ids, dtype=np.uint64)
        padded: npt.NDArray[np.uint64] = np.concatenate([np.full(3, self.pad, dtype=np.uint64), arr])
        n = len(arr)
        a = padded[start : n]
        b = padded[start + 1 : n + 1]
        c = padded[start + 2 : n + 2]
        m = np.uint64(_M32)
        v = np.uint64(version & _M32)
        h = (a * np.uint64(_K_A) + b * np.uint64(_K_B) + c * np.uint64(_K_C)
             + v * np.uint64(_K_V) + np.uint64(_K_0)) & m
        h ^= h >> np.uint64(15)
        h = (h * np.uint64(_K_MIX1)) & m
        h ^= h >> np.uint64(12)
        h = (h * np.uint64(_K_MIX2)) & m
        h ^= h >> np.uint64(15)
        return (h % np.uint64(self.rows)).astype(np.int64)

    def context(self, ids: Sequence[int]) -> tuple[int, int, int]:
        """The three ids before the next position (padded at the start of a sequence)."""
        tail = list(ids[-3:])
        return tuple([self.pad] * (3 - len(tail)) + tail)  # type: ignore[return-value]

    # -- scoring --------------------------------------------------------------------

    def score(self, ids: Sequence[int], start: int, version: int) -> list[float]:
        """``[logprob(ids[i] | ids[:i]) for i in start..len(ids)-1]`` as Python floats."""
        if not 0 <= start <= len(ids):
            raise ValueError(f"start must be between 0 and {len(ids)}")
        for t in ids:
            if not 0 <= t < self.vocab_size:
                raise ValueError(f"token id {t} is not in the vocabulary")
        if start == len(ids):
            return []
        rows = self.rows_for(ids, start, version)
        tokens = np.asarray(ids[start:], dtype=np.int64)
        return self.table(version)[rows, tokens].tolist()

    # -- sampling -------------------------------------------------------------------

    def draw(
        self,
        rng: np.random.Generator,
        row: int,
        version: int,
        allowed: np.ndarray,
        allowed_key: str,
        temperature: float,
        top_p: float,
        top_k: int,
    ) -> int:
        """Sample one id from ``allowed`` under the row's distribution, tempered.

        ``temperature`` below 1e-5 is greedy, like vLLM."""
        key = (version, row, allowed_key, temperature, top_p, top_k)
        cached = self._dist_cache.get(key)
        if cached is None:
            cached = self._distribution(row, version, allowed, temperature, top_p, top_k)
            if len(self._dist_cache) >= _DIST_CACHE_LIMIT:
                self._dist_cache.clear()
            self._dist_cache[key] = cached
        ids, cdf = cached
        if len(ids) == 1:
            return int(ids[0])
        j = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
        return int(ids[min(j, len(ids) - 1)])

    def _distribution(self, row, version, allowed, temperature, top_p, top_k):
        logp = self.table(version)[row, allowed]
        if temperature < 1e-5:
            best = int(np.argmax(logp))
            return allowed[best : best + 1], np.ones(1)
        x = logp / temperature
        p = np.exp(x - x.max())
        ids = allowed
        if top_k > 0 or top_p < 1.0:
            order = np.argsort(-p, kind="stable")
            p, ids = p[order], allowed[order]
            if top_k > 0:
                p, ids = p[:top_k], ids[:top_k]
            if top_p < 1.0:
                cum = np.cumsum(p) / p.sum()
                keep = int(np.searchsorted(cum, top_p, side="left")) + 1
                p, ids = p[:keep], ids[:keep]
        return ids, np.cumsum(p)

    def top_logprobs(self, row: int, version: int) -> tuple[np.ndarray, np.ndarray]:
        """The row's 20 most likely ids and their log-probs, best first (ties by id)."""
        key = (version, row)
        cached = self._top_cache.get(key)
        if cached is None:
            values = self.table(version)[row]
            part = np.argpartition(-values, _TOP_N)[:_TOP_N]
            order = np.lexsort((part, -values[part]))
            ids = part[order]
            cached = (ids, values[ids])
            if len(self._top_cache) >= _DIST_CACHE_LIMIT:
                self._top_cache.clear()
            self._top_cache[key] = cached
        return cached

    # -- vLLM's --logprobs-mode -------------------------------------------------------

    def processed_logits(self, row: int, version: int, temperature: float, top_p: float,
                         top_k: int) -> np.ndarray:
        """The row's logits after temperature, top-k and top-p (removed tokens are -inf), as vLLM's sampler sees them."""
        key = (version, row, temperature, top_p, top_k)
        cached = self._processed_cache.get(key)
        if cached is not None:
            return cached
        x = self.table(version)[row] + LOGIT_SHIFT
        if temperature >= 1e-5:
            x = x / temperature
        keep = np.ones(len(x), dtype=bool)
        order = np.argsort(-x, kind="stable")
        if top_k > 0:
            keep[order[top_k:]] = False
        if top_p < 1.0:
            kept = order[keep[order]]
            p = np.exp(x[kept] - x[kept].max())
            cum = np.cumsum(p) / p.sum()
            cut = int(np.searchsorted(cum, top_p, side="left")) + 1
            keep[kept[cut:]] = False
        out = np.where(keep, x, -np.inf)
        out.setflags(write=False)
        if len(self._processed_cache) >= _DIST_CACHE_LIMIT:
            self._processed_cache.clear()
        self._processed_cache[key] = out
        return out

    def reported(self, mode: str, row: int, version: int, token: int, temperature: float, top_p: float,
                 top_k: int) -> float:
        """What vLLM reports as ``logprob`` for ``token`` at ``row`` under ``--logprobs-mode mode``."""
        if mode == "raw_logprobs":
            return float(self.table(version)[row, token])
        if mode == "raw_logits":
            return float(self.table(version)[row, token] + LOGIT_SHIFT)
        x = self.processed_logits(row, version, temperature, top_p, top_k)
        if mode == "processed_logits":
            return float(x[token])
        finite = x[np.isfinite(x)]
        return float(x[token] - (finite.max() + np.log(np.exp(finite - finite.max()).sum())))
