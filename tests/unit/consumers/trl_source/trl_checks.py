"""Checks against TRL's and OpenEnv's own code; run in .venv-vllm by ``test_trl_openenv`` (never collected
from the core venv: the file name is not ``test_*``).

Inputs: ``$TRL_RECORDS_DIR/<scenario>.avro`` (a delivered record, encoded as the Kafka sink writes it)
and ``<scenario>.expected.json`` (the rows TRL must build, computed from the captured calls:
``scenarios.expected_sequences``). For each: our turns pass OpenEnv's ``TrainingTrace`` models and
``validate_training_turn``; TRL's ``_turns_from_training_trace`` and ``_chain_to_sequences`` build
exactly the expected rows; TRL's own ``_HarnessRolloutLoop._run_session`` drives our session to the
same rows and the record's reward (None for a masked rollout); the factory pickles; the
``rollout_func`` gives GRPOTrainer's keys.
"""

from __future__ import annotations

import functools
import json
import os
import pickle
import threading
import types
from pathlib import Path

import pytest
from openenv.core.harness import TrainableSession, TrainingTrace
from openenv.core.harness.capture.validate import validate_training_turn
from trl.experimental.async_grpo.async_rollout_worker import _chain_to_sequences
from trl.experimental.async_grpo.openenv_harness import _HarnessRolloutLoop, _turns_from_training_trace

from consumers.trl_source import convert_rollout
from consumers.trl_source.records import RebuiltTopic
from consumers.trl_source.rollout_func import make_rollout_func, tokentrail_reward
from consumers.trl_source.rows import ROW_KEYS
from consumers.trl_source.session import HarnessOutcome, HarnessRun, TokentrailSessionFactory, training_trace
from schemas.codec import decode_rebuilt

RECORDS = Path(os.environ.get("TRL_RECORDS_DIR", "/nonexistent"))
NAMES = sorted(p.stem for p in RECORDS.glob("*.avro"))


def load(name: str):
    record = decode_rebuilt((RECORDS / f"{name}.avro").read_bytes())
    expected = json.loads((RECORDS / f"{name}.expected.json").read_text())
    return record, expected


def rows_of(sequences) -> list[dict]:
    return [{"input_ids": list(s.input_ids), "completion_mask": list(s.completion_mask),
             "old_log_probs": [float(v) for v in s.old_log_probs]} for s in sequences]


def test_there_are_records_to_check():
    assert {"masked_rollout", "rich", "tool_calls", "untrained_summary", "masked_subagent"} <= set(NAMES), NAMES


@pytest.mark.parametrize("name", NAMES)
def test_openenv_accepts_our_turns_and_trl_builds_the_captured_sequences(name):
    record, expected = load(name)
    converted = convert_rollout(record)
    trace = training_trace(converted)  # OpenEnv's strict pydantic models: each turn validated on construction
    assert isinstance(trace, TrainingTrace) and len(trace.turns) == len(converted.turns)
    for turn in trace.turns:
        validate_training_turn(turn.prompt_token_ids, turn.completion_token_ids, turn.per_token_logps, turn.loss_mask)
    again = TrainingTrace.from_entries(trace.to_trace_entries())  # the entries TRL hands to reward functions
    assert [t.model_dump(exclude={"metadata"}) for t in again.turns] == [
        t.model_dump(exclude={"metadata"}) for t in trace.turns]
    turns = _turns_from_training_trace(trace)
    sequences, tally = _chain_to_sequences(turns, record.rollout_id, 0)  # lossless capture: fork_threshold 0
    assert rows_of(sequences) == expected["sequences"]
    assert tally["realign"] == 0  # nothing of ours is ever overwritten


def scripted_harness(run: HarnessRun) -> HarnessOutcome:
    """A harness stand-in: TRL's loop does not see the harness, only the session around it."""
    assert "/ng-rollout/" + run.rollout_id + "/training-token-capture" in run.base_url
    return HarnessOutcome(result={"reward": 1.0}, final_text="done")


class FixedRecord:
    """A record source that always answers one record (the real one reads the Kafka sink's topic)."""

    def __init__(self, record) -> None:
        self.record = record

    def wait(self, rollout_id, since_ms, deadline):
        return self.record


class Finishes:
    def __init__(self) -> None:
        self.finished: list[str] = []

    def __call__(self, rollout_id: str, outcome: HarnessOutcome) -> None:
        self.finished.append(rollout_id)


def factory_for(record, finish=None) -> TokentrailSessionFactory:
    return TokentrailSessionFactory(interceptor_url="http://interceptor:9000", harness=scripted_harness,
                                    records=FixedRecord(record), finish=finish or Finishes(), sampling={})


@pytest.mark.parametrize("name", NAMES)
def test_trls_harness_loop_drives_our_session_to_the_same_rows_and_reward(name):
    record, expected = load(name)
    finish = Finishes()
    loop = types.SimpleNamespace(
        _factory=factory_for(record, finish), _live_sessions=set(), _stop_event=threading.Event(), _adapter=None,
        _rollout_reward_fn=None, _fork_threshold_tokens=0, _EMPTY_ROLLOUT=_HarnessRolloutLoop._EMPTY_ROLLOUT)
    (completion, completion_ids, sequences, _, _, reward), metrics = _HarnessRolloutLoop._run_session(loop, "task", 3)
    assert rows_of(sequences) == expected["sequences"]
    assert reward == expected["reward"]  # None for the masked rollout: TRL leaves it out of the baseline
    assert metrics["sequences"] == len(expected["sequences"]) and len(finish.finished) == 1
    assert finish.finished[0].startswith("trl-")


def test_the_session_is_trainable_and_the_factory_pickles_for_trls_spawned_child():
    record, _ = load("tool_calls")
    partial = functools.partial(TokentrailSessionFactory, interceptor_url="http://i:9000", harness=scripted_harness,
                                records=RebuiltTopic("localhost:9092"))
    again = pickle.loads(pickle.dumps(partial))
    factory = again(sampling={"temperature": 1.0})
    assert factory.records.bootstrap == "localhost:9092" and factory.sampling == {"temperature": 1.0}
    session = factory_for(record).create("task", seed=1, episode_id="abc")
    assert isinstance(session, TrainableSession) and session.rollout_id == "trl-abc"


def test_the_rollout_func_gives_grpo_trainer_its_keys_one_row_per_repeated_prompt():
    record, _ = load("tool_calls")
    func = make_rollout_func(factory_for(record), max_workers=2)
    trainer = types.SimpleNamespace(processing_class=types.SimpleNamespace(eos_token_id=0), num_generations=2)
    out = func(["p1", "p1", "p2", "p2"], trainer)  # TRL 1.16 repeats each prompt num_generations times
    assert set(out) == set(ROW_KEYS) and all(len(v) == 4 for v in out.values())
    for prompt, completion, logprobs, mask in zip(out["prompt_ids"], out["completion_ids"], out["logprobs"],
                                                  out["env_mask"]):
        assert prompt and len(completion) == len(logprobs) == len(mask)
    assert tokentrail_reward([], [], tokentrail_reward=out["tokentrail_reward"]) == [0.75] * 4
