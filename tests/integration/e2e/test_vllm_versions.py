"""Weight updates under running streamed calls, on the real engine: per-token versions, token-exact.

The trainer's sync is ``compose.engines.vllm_rig.weights.push_weights``: pause, reload perturbed weights
in place (``/collective_rpc reload_weights``), name them, announce them to the interceptor, resume.
vLLM 0.32's chat route reports no per-token versions, so the interceptor splits the stream where
the announced version changed. The proof that the split is at the right token is in the log-probs:
every token before it scores exactly (bit-equal) under the old weights, every token after it under
the new ones, and the two weight sets give different values.

The stream is bounded (``MAX_TOKENS``, client timeout) and a failed sync resumes the engine, so a
fault here fails the test instead of freezing the stream (a 20,000-token stream once ran out CI's clock).
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from compose.engines.vllm_rig.admin import resume
from compose.engines.vllm_rig.engine import score_prompt
from compose.engines.vllm_rig.weights import push_weights, read_safetensors, write_safetensors
from compose.rig.stack import LocalStack

pytestmark = [pytest.mark.integration, pytest.mark.real_broker, pytest.mark.vllm]

# Enough tokens to outlast the pause: vLLM's /pause lands between engine steps, and on 2 busy
# cores it was seen to take up to ~15 s (~2,000 tokens at this model's ~130 tokens/s); few enough
# that the stream and its rescoring take about a minute and a half, not CI's clock.
MAX_TOKENS = 10_000


@pytest.fixture
def engine(vllm_random_engine):
    return vllm_random_engine  # tests/integration/conftest.py: shared, weights put back by whoever changes them


def _served_dir(engine_url: str) -> Path:
    return Path(httpx.get(f"{engine_url}/v1/models", timeout=30).json()["data"][0]["root"])


def _weights(directory: Path) -> dict[str, np.ndarray]:
    tensors: dict[str, np.ndarray] = {}
    for path in sorted(directory.glob("*.safetensors")):
        tensors.update(read_safetensors(path))
    return tensors


def _perturbed(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = dict(tensors)
    name = "lm_head.weight" if "lm_head.weight" in out else max(out, key=lambda k: out[k].size)
    out[name] = (out[name].astype(np.float32) * 2.0).astype(out[name].dtype)
    return out


def _stack(kafka_bootstrap, tmp_path_factory, engine, *args: str) -> LocalStack:
    tag = uuid.uuid4().hex[:8]
    return LocalStack(kafka_bootstrap, tmp_path_factory.mktemp("vv"), topic_prefix=f"vv{tag}.",
                      processor_id=f"vv{tag}", upstream_url=engine.url, intercept_args=args)


def _announce(stack: LocalStack):
    def announce(label: str) -> None:
        r = httpx.post(f"{stack.interceptor_url}/tokentrail/admin/policy-version", json={"version": label},
                       headers={"authorization": f"Bearer {stack.control_token}"}, timeout=30)
        r.raise_for_status()
    return announce


def _stream_across_a_sync(stack: LocalStack, engine, rid: str, mode: str, new: Path) -> str:
    """One streamed call; at its first chunk the trainer pushes ``new`` as "v1" with ``/pause?mode=mode``."""
    _announce(stack)("v0")
    client = openai.OpenAI(base_url=stack.capture_base_url(rid), api_key="unused", max_retries=0, timeout=180)
    stream = client.chat.completions.create(model="any", messages=[{"role": "user", "content": "go"}],
                                            max_tokens=MAX_TOKENS, stream=True, extra_body={"ignore_eos": True})
    synced, failures, parts, finishes, took = threading.Event(), [], [], [], []

    def sync() -> None:
        started = time.monotonic()
        try:
            push_weights(engine.url, new, "v1", pause_mode=mode, announce=_announce(stack))
        except Exception as exc:  # surfaced below
            failures.append(exc)
            resume(engine.url)  # push_weights leaves a failed sync paused; the frozen stream must end
        finally:
            took.append((time.monotonic() - started, len(parts)))
            synced.set()

    for chunk in stream:
        if not synced.is_set() and not parts:
            threading.Thread(target=sync, daemon=True).start()
        for c in chunk.choices:
            parts.append(c.delta.content or "")
            if c.finish_reason:
                finishes.append(c.finish_reason)
    assert synced.wait(120) and not failures, failures
    (seconds, seen), = took
    assert seen < len(parts), f"the stream ended before the sync ({seconds:.1f} s): the pause landed too late"
    assert finishes == ["length"], finishes  # one answer, whole: the harness never saw the sync
    stack.finish(rid, {"reward": 1.0})
    return "".join(parts)


def _assert_split_is_exact(engine_url: str, record: dict, old: Path, new: Path, source: str) -> None:
    traj = record["trajectory"]
    (span,) = traj["spans"]
    versions = span["version_spans"]
    assert [v["version"] for v in versions] == ["v0", "v1"], versions
    assert span["version_source"] == source and span["dispatch_version"] == "v0"
    cut = versions[0]["end"]
    assert span["generation_start"] < cut < span["end"], versions
    ids, logprobs = traj["token_ids"], traj["log_probs"]
    generated = [i for i, bit in enumerate(traj["loss_mask"]) if bit]
    by_position = dict(zip(generated, logprobs, strict=True))
    under_new = score_prompt(engine_url, ids)  # the engine now holds the new weights
    push_weights(engine_url, old, "v0-again")
    under_old = score_prompt(engine_url, ids)
    # Which weights sampled each token: the one whose score it matches. A re-scored prefill and the
    # sampling decode differ in the last bits on this CPU build once the KV was recomputed (~2e-4 at
    # most seen), so a token tells the weights apart only where the two scores differ by far more
    # than that (most do: lm_head x2); the others must match both, within that noise.
    told: dict[int, str] = {}
    for i in generated:
        old_d, new_d = abs(by_position[i] - under_old[i - 1]), abs(by_position[i] - under_new[i - 1])
        assert min(old_d, new_d) < 1e-3, (i, by_position[i], under_old[i - 1], under_new[i - 1])
        if abs(under_old[i - 1] - under_new[i - 1]) > 1e-2:
            told[i] = "old" if old_d < new_d else "new"
    assert sum(i < cut for i in told) > 0 and sum(i >= cut for i in told) > 0, (cut, len(told))
    # A short message: pytest's diff of two dicts of thousands of positions runs for many minutes.
    wrong = sorted(i for i, weights in told.items() if weights != ("old" if i < cut else "new"))
    assert not wrong, (f"{len(wrong)} of {len(told)} telling tokens sampled by the other weights than their "
                       f"label says (cut {cut}); first {wrong[:10]}, last {wrong[-3:]}")
    push_weights(engine_url, new, "v1-again")
    push_weights(engine_url, old, "v0")  # the next test starts from the served weights


@pytest.mark.parametrize(("mode", "policy"), [("keep", "mask"), ("abort", "continue")])
def test_a_stream_across_a_weight_update_has_two_version_spans_at_the_right_token(
        kafka_bootstrap, tmp_path_factory, engine, mode, policy):
    old = _served_dir(engine.url)  # the served checkpoint
    new = tmp_path_factory.mktemp("v1-weights")
    write_safetensors(new / "model.safetensors", _perturbed(_weights(old)))
    with _stack(kafka_bootstrap, tmp_path_factory, engine, "--abort-policy", policy) as stack:
        rid = f"sync-{mode}-{uuid.uuid4().hex[:6]}"
        _stream_across_a_sync(stack, engine, rid, mode, new)
        record = stack.wait_rollouts([rid], timeout=180)[rid]
    assert record["mask_sample"] is False, record["mask_reasons"]
    # keep: where the stream saw the announcement; abort + continue: the parts (producers.capture.core)
    _assert_split_is_exact(engine.url, record, old, new, "observed" if mode == "keep" else "bracket")
