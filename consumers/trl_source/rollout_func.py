"""A ``rollout_func`` for ``trl.GRPOTrainer`` (TRL 1.16) on the same sessions and converter.

``make_rollout_func(factory)`` returns ``rollout_func(prompts, trainer)``. TRL 1.16 hands it the
batch's prompts already repeated (each ``num_generations`` times in a row, as its sampler lays
them out) and wants one row per entry: so it runs one session per entry
(``TokentrailSessionFactory.create(prompt, seed=entry // num_generations)`` ...
``wait_for_completion``, ``max_workers`` at once), converts each delivered record and returns
the rows in the prompts' order (``consumers.trl_source.rows``: ``prompt_ids``, ``completion_ids``,
``logprobs``, ``env_mask`` and extra keys TRL hands to reward functions). A session that fails
(the harness raised, no record in time) gives an unscorable row, never an exception that would
stop training. ``tokentrail_reward`` is the reward to train on: pass
``reward_funcs=[tokentrail_reward]``; it returns None for an unscorable row.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from consumers.trl_source.convert import ConvertedRollout
from consumers.trl_source.rows import ROW_KEYS, grpo_row
from consumers.trl_source.session import TokentrailSessionFactory

__all__ = ["make_rollout_func", "tokentrail_reward"]

log = logging.getLogger("tokentrail.trl_source")


def tokentrail_reward(prompts: list[Any], completions: list[Any], tokentrail_reward: list[float | None],
                      **_: Any) -> list[float | None]:
    """A TRL reward function: the rollout's reward as tokentrail delivered it (None: unscorable)."""
    return list(tokentrail_reward)


def make_rollout_func(factory: TokentrailSessionFactory, *, max_workers: int = 8,
                      fallback_token_id: int | None = None) -> Callable[[list[Any], Any], dict[str, list[Any]]]:
    """``rollout_func(prompts, trainer)`` (see the module docstring); ``fallback_token_id`` defaults to
    the trainer's EOS token (the lone token of a row without any trajectory)."""

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        fallback = fallback_token_id if fallback_token_id is not None else trainer.processing_class.eos_token_id
        per_group = max(1, int(getattr(trainer, "num_generations", 1) or 1))
        jobs = [(prompt, entry // per_group) for entry, prompt in enumerate(prompts)]
        with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(jobs)))) as pool:
            rows = list(pool.map(lambda job: _one(factory, job[0], job[1], fallback), jobs))
        return {key: [row[key] for row in rows] for key in ROW_KEYS}

    return rollout_func


def _one(factory: TokentrailSessionFactory, prompt: Any, group: int, fallback: int) -> dict[str, Any]:
    session = factory.create(prompt, seed=group)
    try:
        session.wait_for_completion()
    except Exception as exc:  # one failed rollout is an unscorable row, not a failed training step
        log.warning("rollout %s failed: %s", session.rollout_id, exc)
    finally:
        session.close()
    if session.record is None or session.converted is None:
        converted = ConvertedRollout(rollout_id=session.rollout_id, snapshot_id="", version=0, reward=None,
                                     traces=[], unscorable=["the session produced no delivered record"])
        return grpo_row(None, converted, fallback_token_id=fallback)
    return grpo_row(session.record, session.converted, fallback_token_id=fallback)

