"""Paced decode on the test rig's engine: a request asks for at least N ms per generated token.

This tiny model decodes ~13,000 tokens/s on one CPU core, so a 4,000-token stream is generated in ~0.3 s
while its harness reads it for ~20 s. A test that must land ``/pause`` while the engine is still
generating (a weight update across a stream) cannot ask for it in time from the harness's side: on CI
the harness read its first chunk only after the engine had finished, in every attempt. A paced request
gives the engine a known speed, so "the pause landed mid-generation" no longer depends on the host's load.

The engine side is ``compose.engines.vllm_rig.paced_decode.PacedDecode`` (``--logits-processors``, vLLM's
environment); this module is what a harness needs and imports nothing of vLLM's.
"""

from __future__ import annotations

__all__ = ["ARG", "FLAGS", "paced"]

ARG = "tokentrail_decode_ms"  # the key in the request's vllm_xargs (vLLM's SamplingParams.extra_args)
FLAGS = ("--logits-processors", "compose.engines.vllm_rig.paced_decode:PacedDecode")


def paced(ms: float) -> dict[str, dict[str, float]]:
    """The request-body fields that pace a call at ``ms`` per generated token (merge into ``extra_body``)."""
    if not 0 < ms <= 1000:
        raise ValueError(f"ms={ms!r}: the pace must be in (0, 1000] milliseconds per token")
    return {"vllm_xargs": {ARG: ms}}
