"""New weights pushed into the running vLLM CPU server serve the very next requests, and the label
follows them.

What was tried on this build (vLLM 0.32.0, CPU), one engine per probe:

* ``POST /update_weights`` (``/init_weight_transfer_engine``, ``/start_weight_update``,
  ``/finish_weight_update``) without ``--weight-transfer-config``: 500 "Weight transfer not
  configured. Please set weight_transfer_config to enable weight transfer." (checked below).
  With ``--weight-transfer-config '{"backend": "ipc"}'``: init and start answer 200, then
  ``/update_weights`` answers 500 "Found no NVIDIA driver on your system" (the worker rebuilds
  CUDA IPC handles), ``/finish_weight_update`` 500 "finish_weight_update called without a matching
  start_weight_update.", and the next completion kills the worker (segfault: the layers were left
  half-reloaded). nccl, sparse_nccl, nccl_m2n, sharded_rdt and modelexpress are GPU/RDMA transports
  too. No ``/update_weights`` backend works on CPU.
* ``POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}}`` (dev mode)
  reloads every tensor in place: ~0.2 s for this checkpoint. That is ``push_weights``.
"""

from __future__ import annotations

import time

import httpx
import pytest

from compose.engines.vllm_rig import admin
from compose.engines.vllm_rig.admin import WeightPushError, is_paused, weight_info
from compose.engines.vllm_rig.engine import SERVED_NAME, checkpoint, score_prompt
from compose.engines.vllm_rig.weights import MECHANISM, push_weights, read_safetensors

pytestmark = [pytest.mark.vllm]

PROMPT = list(range(100, 120))


@pytest.fixture
def engine(vllm_random_engine):
    return vllm_random_engine  # tests/integration/conftest.py: shared, weights put back by whoever changes them


def greedy(url: str) -> tuple[list[int], list[float]]:
    """Four greedy tokens after PROMPT and their log-probs."""
    r = httpx.post(f"{url}/v1/completions", timeout=120, json={
        "model": SERVED_NAME, "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "logprobs": 0,
        "return_token_ids": True})
    r.raise_for_status()
    choice = r.json()["choices"][0]
    return choice["token_ids"], choice["logprobs"]["token_logprobs"]


def observed(url: str) -> tuple[list[float], tuple[list[int], list[float]]]:
    return score_prompt(url, PROMPT), greedy(url)


def test_pushed_weights_serve_the_next_requests_and_the_label_follows(engine):
    url, served = engine.url, checkpoint("random")
    assert weight_info(url) != "step-1"  # "default" on a fresh engine; the shared one may carry a label
    before = observed(url)

    perturbed = read_safetensors(served / "model.safetensors")
    perturbed["lm_head.weight"] *= 2.0  # sharper logits: every log-prob moves, deterministically
    started = time.monotonic()
    assert push_weights(url, perturbed, "step-1") == MECHANISM
    print(f"push_weights (state dict, {len(perturbed)} tensors): {time.monotonic() - started:.3f} s")
    assert weight_info(url) == "step-1" and not is_paused(url)
    after = observed(url)
    assert all(a != b for a, b in zip(after[0], before[0], strict=True)), "a prompt log-prob did not move"
    assert after[1][1] != before[1][1]

    # The served checkpoint directory pushed back: bit-identical to before, so nothing else changed.
    assert push_weights(url, served, "step-0", pause_mode="keep") == MECHANISM
    assert weight_info(url) == "step-0"
    assert observed(url) == before


def test_a_set_unlike_the_served_checkpoint_is_refused_before_the_engine_is_touched(engine):
    url, served = engine.url, checkpoint("random")
    label, before = weight_info(url), score_prompt(url, PROMPT)
    full = read_safetensors(served / "model.safetensors")
    missing = {k: v for k, v in full.items() if k != "lm_head.weight"}
    with pytest.raises(WeightPushError, match=r"missing \['lm_head.weight'\]"):
        push_weights(url, missing, "bad")
    with pytest.raises(WeightPushError, match="wrong shape"):
        push_weights(url, {**full, "lm_head.weight": full["lm_head.weight"][:-1]}, "bad")
    assert weight_info(url) == label and not is_paused(url) and score_prompt(url, PROMPT) == before


def test_the_transfer_routes_refuse_on_cpu_and_the_error_names_the_answer(engine):
    url = engine.url
    before = score_prompt(url, PROMPT)
    with pytest.raises(WeightPushError, match="/start_weight_update.*500.*Weight transfer not configured"):
        admin.call("POST", url, "/start_weight_update")
    assert score_prompt(url, PROMPT) == before  # the refusal changed nothing
