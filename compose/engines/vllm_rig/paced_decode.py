"""The engine side of ``compose.engines.vllm_rig.pace``: a vLLM logits processor that paces a request's decode.

Loaded into the test rig's random engine (``--logits-processors
compose.engines.vllm_rig.paced_decode:PacedDecode``); it runs inside the engine's own environment, so it
imports vLLM and torch (tokentrail's side imports ``pace`` only). The logits are never changed, so
sampling and log-probs are exactly the unpaced engine's.

Guarantee: while any paced request is in the batch, each engine step that samples takes at least the
largest requested pace (it sleeps the rest); a step with none sleeps not at all. The sleep holds the
engine core, so a ``/pause`` lands at most one paced step late.
"""

from __future__ import annotations

import time

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from compose.engines.vllm_rig.pace import ARG

__all__ = ["PacedDecode"]


def _pace(params: SamplingParams, _prompt: list[int] | None, _output: list[int]) -> float | None:
    value = (params.extra_args or {}).get(ARG)
    return None if value is None else float(value) / 1000.0


class PacedDecode(LogitsProcessor):
    """Sleeps each sampling step up to the largest pace asked by a request in the batch; logits pass as they are."""

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        value = (sampling_params.extra_args or {}).get(ARG)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1000):
            raise ValueError(f"vllm_xargs.{ARG}={value!r} must be a number of milliseconds in (0, 1000]")

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        self._paces: dict[int, float] = {}
        self._last = time.monotonic()

    def is_argmax_invariant(self) -> bool:
        return False  # it changes nothing, but an invariant processor is skipped for greedy requests

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self._paces, batch_update, _pace)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        now = time.monotonic()
        if self._paces:
            rest = max(self._paces.values()) - (now - self._last)
            if rest > 0:
                time.sleep(rest)
                now = time.monotonic()
        self._last = now
        return logits
