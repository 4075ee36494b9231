"""The trainer of ``tokentrail demo-trl``: TRL 1.16's ``GRPOTrainer`` with tokentrail's ``rollout_func``.

Runs in the engine's environment (``.venv-vllm``: torch, TRL; OpenEnv's fastmcp from the overlay on
``PYTHONPATH``), started by ``compose/tools/trl_demo/run.py``. A script, not a module of a package:
it imports torch, which tokentrail's environment does not have.

Protocol: argv[1] is the run's JSON (``checkpoint``, ``steps``, ``group_size``, ``prompts``, ``lr``,
``seed``, ``output_dir``). It builds the trainer at once (TRL's imports and the model load overlap
the stack's start), prints ``{"event": "ready"}``, then reads one stdin line, the stack
(``interceptor_url``, ``bootstrap``, ``topic``, ``rollout_prefix``, ``model``, ``tool_calls``;
the control token comes as ``$TOKENTRAIL_CONTROL_TOKEN``), and trains. Every event is one stdout line,
``tokentrail-demo-trl `` and a JSON object (TRL prints lines of its own). Per step it prints
``{"event": "batch", "rows": [...]}``: each row as TRL holds it in the batch it computes the loss on
(``prompt_ids``, ``completion_ids``, ``env_mask`` and the sampled ``logprobs`` unpadded, the reward
and the advantage), next to the rollout id the plugin's row named; then TRL's log of that step as
``{"event": "log", ...}`` (the loss among it), and ``{"event": "done"}`` at the end. Errors: one
``{"event": "error", "error": ...}`` line, exit 1.

Each rollout is ``compose.harnesses.sdk.run_rollout`` (the OpenAI SDK agent: a weather tool, several
turns) against the interceptor under the rollout's id; its reward is the share of lowercase ASCII
letters in the final answer (text only, so any engine's answers can be scored), and a harness
error finishes the rollout without a reward (unscorable: TRL trains nothing of it).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
import traceback
import zlib
from typing import Any

STACK: dict[str, Any] = {}  # filled from stdin before the first rollout; read by the harness


def emit(event: str, **fields: Any) -> None:
    print("tokentrail-demo-trl " + json.dumps({"event": event, **fields}), flush=True)


def lowercase_share(text: str) -> float:
    """The reward: the share of the answer's characters that are lowercase ASCII letters (0.0 for no text)."""
    return sum(ch.islower() and ch.isascii() for ch in text) / max(len(text), 1)


def sdk_harness(run: Any) -> Any:
    """One SDK agent rollout against ``run.base_url`` (a module-level callable, as the session factory wants)."""
    from compose.harnesses.sdk import run_rollout
    from consumers.trl_source.session import HarnessOutcome

    o = asyncio.run(run_rollout(run.base_url + "/v1", run.rollout_id, str(run.task), model=STACK["model"],
                                tool_calls=STACK["tool_calls"], timeout=120,
                                seed=zlib.crc32(run.rollout_id.encode())))  # one seed per rollout, not per prompt
    if o.error is not None:
        return HarnessOutcome(result={"harness_error": o.error}, final_text=o.final_text, exit_code=1)
    return HarnessOutcome(result={"reward": lowercase_share(o.final_text or "")}, final_text=o.final_text,
                          final_response_id=o.final_response_id)


def build(config: dict[str, Any]) -> Any:
    from datasets import Dataset  # type: ignore[import-not-found]
    from transformers import TrainerCallback  # type: ignore[import-not-found]
    from trl import GRPOConfig, GRPOTrainer  # type: ignore[import-not-found]

    from consumers.trl_source.records import RebuiltTopic
    from consumers.trl_source.rollout_func import make_rollout_func, tokentrail_reward
    from consumers.trl_source.session import TokentrailSessionFactory

    last: dict[str, list[Any]] = {}

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        factory = TokentrailSessionFactory(
            interceptor_url=STACK["interceptor_url"], harness=sdk_harness,
            records=RebuiltTopic(STACK["bootstrap"], STACK["topic"], poll_s=0.2),
            rollout_prefix=f"{STACK['rollout_prefix']}-s{trainer.state.global_step + 1}", timeout_s=180)
        out = make_rollout_func(factory)(prompts, trainer)
        last.clear()
        last.update(out)
        return out

    class Recording(GRPOTrainer):
        """GRPOTrainer that prints each batch as it holds it for the loss (what the step trains on)."""

        def _generate_and_score_completions(self, inputs: Any) -> Any:
            out = super()._generate_and_score_completions(inputs)
            rows = []
            for i, rollout_id in enumerate(last["tokentrail_rollout_id"]):
                prompt = out["prompt_ids"][i][out["prompt_mask"][i].bool()].tolist()
                n = int(out["completion_mask"][i].sum())
                logps = out.get("sampling_per_token_logps")
                reward = last["tokentrail_reward"][i]
                rows.append({
                    "rollout_id": rollout_id, "reward": reward, "unscorable": last["tokentrail_unscorable"][i],
                    "dropped": last["tokentrail_dropped"][i], "policy_version": last["policy_version"][i],
                    "advantage": _finite(float(out["advantages"][i])),
                    "prompt_ids": prompt, "completion_ids": out["completion_ids"][i][:n].tolist(),
                    "env_mask": out["tool_mask"][i][:n].tolist() if "tool_mask" in out else None,
                    "logprobs": [_finite(x) for x in logps[i][:n].tolist()] if logps is not None else None})
            emit("batch", step=self.state.global_step + 1, rows=rows)
            return out

    class Logs(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **_: Any) -> None:
            emit("log", step=state.global_step, logs={k: v for k, v in (logs or {}).items()
                                                      if isinstance(v, int | float)})

    g = config["group_size"]
    args = GRPOConfig(output_dir=config["output_dir"], use_cpu=True, use_vllm=False, num_generations=g,
                      per_device_train_batch_size=g, max_steps=config["steps"], learning_rate=config["lr"],
                      logging_steps=1, report_to=[], bf16=False, save_strategy="no", seed=config["seed"],
                      max_completion_length=config["max_completion_length"], dataloader_num_workers=0,
                      disable_tqdm=True)
    prompts = config["prompts"]
    dataset = Dataset.from_dict({"prompt": [prompts[i % len(prompts)] for i in range(config["steps"])]})
    return Recording(model=config["checkpoint"], reward_funcs=[tokentrail_reward], args=args, train_dataset=dataset,
                     rollout_func=rollout_func, callbacks=[Logs()])


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None  # JSON has no NaN (an unscorable row's reward becomes NaN in TRL)


def main() -> int:
    try:
        trainer = build(json.loads(sys.argv[1]))
        emit("ready", pid=os.getpid())
        line = sys.stdin.readline()
        if not line:
            return 0  # the demo gave up before the stack was up
        STACK.update(json.loads(line))
        trainer.train()
        emit("done")
        return 0
    except Exception as exc:  # the demo prints it; the traceback goes to the log
        traceback.print_exc()
        emit("error", error=f"{type(exc).__name__}: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
