"""`make demo-trl`, one step: TRL's GRPOTrainer trains on rows that are the records the stack delivered.

On the reference engine (CI time; `make demo-trl` runs real vLLM): two SDK agent rollouts through
the interceptor, the processor and the consumer, turned into TRL rows by the plugin's rollout_func.
The test reads the delivered records back from the rebuilt topic itself and compares them with the
rows as TRL held them in the batch it computed the loss on (the trainer child prints that batch).
Needs .venv-vllm with TRL (`make trl`): skipped without it, failed under CI or TOKENTRAIL_REQUIRE_TRL=1.
"""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import time

import pytest

from compose.engines.vllm_rig.engine import ROOT, unavailable_reason, vllm_python
from compose.tools.trl_demo.report import DemoOptions
from compose.tools.trl_demo.run import OVERLAY, run_demo
from consumers.trl_source.records import RebuiltTopic

pytestmark = [pytest.mark.integration, pytest.mark.real_broker, pytest.mark.vllm]


def _require_trl() -> None:
    reason = unavailable_reason()
    if reason is None:
        probe = subprocess.run([str(vllm_python()), "-c", "import trl, openenv.core.harness, datasets"],
                               capture_output=True, text=True, timeout=300,
                               env={**os.environ, "PYTHONPATH": f"{ROOT / OVERLAY}{os.pathsep}{ROOT}"})
        reason = None if probe.returncode == 0 else f"TRL/OpenEnv not importable in .venv-vllm: run `make trl` " \
                                                     f"({probe.stderr.strip()[-300:]})"
    if reason is None:
        return
    if os.environ.get("CI") or os.environ.get("TOKENTRAIL_REQUIRE_TRL") == "1":
        pytest.fail(f"the TRL demo must run here: {reason}")
    pytest.skip(reason)


def f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def test_one_grpo_step_trains_on_the_delivered_records(kafka_bootstrap, tmp_path):
    _require_trl()
    result = run_demo(kafka_bootstrap, tmp_path, DemoOptions(steps=1, group_size=2, engine="reference"),
                      say=lambda line: print(line, flush=True))

    assert [s.step for s in result.steps] == [1]
    step = result.steps[0]
    assert len(step.batch) == 2 and len({row["rollout_id"] for row in step.batch}) == 2
    records = RebuiltTopic(kafka_bootstrap, result.topic)
    for row in step.batch:
        record = records.wait(row["rollout_id"], int(time.time() * 1000) - 600_000, time.monotonic() + 30)
        traj = record.trajectory
        assert not record.mask_sample and traj is not None, record.mask_reasons
        assert record.metrics.n_calls == 3  # the SDK agent: two tool calls, then the answer
        # The ids TRL trained on are the delivered trajectory, split at the first call's prompt.
        cut = len(row["prompt_ids"])
        assert row["prompt_ids"] + row["completion_ids"] == traj.token_ids
        assert cut == traj.spans[0].generation_start
        # Its env_mask (TRL's tool_mask) is the trajectory's loss mask; the prompt carries none.
        assert row["env_mask"] == list(traj.loss_mask[cut:]) and not any(traj.loss_mask[:cut])
        # Its sampled log-probs are the captured ones (as float32, TRL's tensor) at every trained token.
        trained = [lp for lp, m in zip(row["logprobs"], row["env_mask"], strict=True) if m]
        assert trained == [f32(lp) for lp in traj.log_probs] and trained
        # The reward TRL scored is the one the harness finished the rollout with.
        assert row["reward"] == json.loads(record.result_json)["reward"]
    # A GRPO step ran on them: advantages are the group-normalised rewards, and TRL logged a loss.
    rewards = [row["reward"] for row in step.batch]
    advantages = [row["advantage"] for row in step.batch]
    assert abs(sum(advantages)) <= 1e-3 * max(map(abs, advantages)) + 1e-6  # float32, rewards close together
    if rewards[0] != rewards[1]:
        assert (advantages[0] > 0) == (rewards[0] > rewards[1])
    assert step.loss is not None and math.isfinite(step.loss)
    assert result.consistent and step.masked_fraction == 0.0
