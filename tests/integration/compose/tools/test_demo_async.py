"""The closed loop of `make demo-async`, short: a trainer's steps on delivered groups change the
running real vLLM engine's weights, the versions advance, and delivered rollouts name them."""

from __future__ import annotations

import pytest

from compose.engines.vllm_rig.engine import checkpoint
from compose.engines.vllm_rig.weights import push_weights
from compose.tools.async_demo.report import DemoOptions
from compose.tools.async_demo.run import run_demo

pytestmark = [pytest.mark.integration, pytest.mark.real_broker, pytest.mark.vllm]


def test_two_trainer_steps_change_the_engines_weights_and_rollouts_name_the_versions(kafka_bootstrap, tmp_path,
                                                                                       vllm_random_engine):
    # The session's random-checkpoint engine (`make demo-async` starts one of its own the same way): the
    # demo pushes the served checkpoint back first, and so does this test when it ends.
    url = vllm_random_engine.url
    try:
        # Printed as it runs, so a failure's captured output shows how far the loop got.
        result = run_demo(kafka_bootstrap, tmp_path, DemoOptions(steps=2, group_size=2, max_tokens=24),
                          say=lambda line: print(line, flush=True), engine_url=url)
    finally:
        push_weights(url, checkpoint("random"), "v0")  # the next test starts from the served weights

    # The engine's weights changed: its log-probs of a fixed prompt moved between step 0 and the last step.
    assert result.weights_changed, (result.before, result.after)
    # The versions advanced, and the engine serves the last one.
    assert result.announced == ["step-0", "step-1", "step-2"]
    assert [s.label for s in result.steps] == ["step-1", "step-2"]
    assert result.engine_version == "step-2"
    # Every step trained on a whole group, and the trainer's forward is the served model: on tokens the
    # weights it held had sampled, its log-probs equal the captured ones up to float32 noise.
    assert all(s.trained_on == 2 and s.tokens > 0 for s in result.steps), [s.line() for s in result.steps]
    assert result.steps[0].on_policy_max_abs is not None and result.steps[0].on_policy_max_abs < 1e-4

    # Delivered rollouts carry per-token version spans naming announced versions, past step 0 too.
    named = [r for r in result.rollouts if r["labels"]]
    assert named, [r["line"] for r in result.rollouts]
    assert all(set(r["labels"]) <= set(result.announced) for r in named), [r["line"] for r in named]
    assert any(set(r["labels"]) - {"step-0"} for r in named), [r["line"] for r in named]
    assert all(r["staleness"] is not None for r in named)
