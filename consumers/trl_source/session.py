"""An OpenEnv ``TrainableSession`` backed by tokentrail, for TRL's ``HarnessRolloutWorker`` (black-box mode).

TRL 1.16 calls ``harness_session_factory(sampling=...)`` once in its rollout worker's spawned
child, then per rollout ``factory.create(prompt, seed=group_id, episode_id=uuid)``,
``session.wait_for_completion()``, ``session.fetch_training_trace()``, ``session.verify(...)``,
``session.close()`` (``trl/experimental/async_grpo/openenv_harness.py``). Here:

- ``create`` mints the rollout id (``<prefix>-<episode_id>``, checked against the id rule);
- ``wait_for_completion`` runs the harness (``harness(HarnessRun) -> HarnessOutcome``, yours) against
  the interceptor's capture URL for that rollout id, finishes the rollout with the harness's
  result through the interceptor's ``POST /rollouts/<id>/finish`` (bearer token from
  ``$TOKENTRAIL_CONTROL_TOKEN``; also when the harness raised, with no reward, so the rollout
  is never left open), waits for the delivered record (``records``, e.g.
  ``consumers.trl_source.records.RebuiltTopic``) and converts it
  (``consumers.trl_source.convert``); a record that does not arrive in ``timeout_s`` raises
  ``TimeoutError`` (TRL flags the rollout timed out; it is then unscorable: no turns, no reward);
- ``fetch_training_trace`` returns the converted turns as OpenEnv's ``TrainingTrace`` (validated by
  OpenEnv's own models); an unscorable rollout returns no turns;
- ``verify`` returns the record's reward (None when unscorable: TRL leaves the rollout out of
  its group baseline) and, in ``metrics``, the rollout id, the oldest loss-bearing policy
  version and step, and why anything was left out.

Everything the factory holds is picklable (``harness`` must be a module-level callable);
``TokentrailSessionFactory`` itself is what ``functools.partial`` wraps for TRL. The classes follow
OpenEnv's ``ResourceSessionFactory`` / ``ResourceSession`` + ``TrainableSession`` by shape (TRL checks
the ``TrainableSession`` protocol, whose methods these are) and import OpenEnv only where they build
its objects, so this module imports, and its factory pickles, where OpenEnv is not installed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from consumers.trl_source.convert import ConvertedRollout, convert_rollout
from consumers.trl_source.records import RecordSource
from schemas.errors import TransportError
from schemas.ids import validate_rollout_id
from schemas.policy_versions import PolicyVersion, VersionBook
from schemas.records import RebuiltRollout

__all__ = ["HarnessOutcome", "HarnessRun", "TokentrailSession", "TokentrailSessionFactory", "training_trace"]

CAPTURE_PATH = "/ng-rollout/{rollout_id}/training-token-capture"
_NOTHING = ConvertedRollout(rollout_id="", snapshot_id="", version=0, reward=None, traces=[],
                            unscorable=["no record"])


@dataclass(frozen=True)
class HarnessRun:
    """What the harness gets: point its API base URL at ``base_url`` (every call is then captured)."""

    rollout_id: str
    base_url: str  # the interceptor's capture prefix for this rollout; append /v1/... as the SDK does
    task: Any
    seed: int | None
    sampling: dict[str, Any]


@dataclass(frozen=True)
class HarnessOutcome:
    """What the harness returns: the finish result (its reward under ``reward_key``) and its final answer."""

    result: dict[str, Any]
    final_text: str | None = None
    final_response_id: str | None = None
    exit_code: int = 0
    transcript: list[dict[str, Any]] = field(default_factory=list)


def training_trace(converted: ConvertedRollout) -> Any:
    """The converted turns as OpenEnv's ``TrainingTrace`` (each turn checked by ``validate_training_turn``)."""
    from openenv.core.harness.training import TrainingTrace, TrainingTurn  # type: ignore[import-not-found]

    return TrainingTrace(turns=[
        TrainingTurn(node_id=t.node_id, prompt_token_ids=t.prompt_token_ids,
                     completion_token_ids=t.completion_token_ids, per_token_logps=t.per_token_logps,
                     loss_mask=t.loss_mask, metadata={**t.metadata, "rollout_id": converted.rollout_id})
        for t in converted.turns])


class TokentrailSession:
    """One rollout (see the module docstring); made by ``TokentrailSessionFactory.create``."""

    def __init__(self, factory: TokentrailSessionFactory, rollout_id: str, task: Any, seed: int | None) -> None:
        self.factory, self.rollout_id, self.task, self.seed = factory, rollout_id, task, seed
        self.started_ms = int(time.time() * 1000)
        self.outcome: HarnessOutcome | None = None
        self.record: RebuiltRollout | None = None
        self.converted: ConvertedRollout | None = None

    def wait_for_completion(self, timeout_s: float | None = None) -> int:
        f = self.factory
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else f.timeout_s)
        base = f.interceptor_url.rstrip("/") + CAPTURE_PATH.format(rollout_id=self.rollout_id)
        run = HarnessRun(rollout_id=self.rollout_id, base_url=base, task=self.task, seed=self.seed,
                         sampling=dict(f.sampling or {}))
        try:
            self.outcome = f.harness(run)
        finally:  # a harness that raised still finishes its rollout (no reward: unscorable), never leaves it open
            outcome = self.outcome or HarnessOutcome(result={"harness_error": True}, exit_code=1)
            f.finish(self.rollout_id, outcome)
        self.record = f.records.wait(self.rollout_id, self.started_ms - 1000, deadline)  # 1 s of clock skew
        self.converted = convert_rollout(self.record, reward_key=f.reward_key, book=f.version_book())
        return outcome.exit_code

    def fetch_training_trace(self) -> Any:
        if self.converted is None or not self.converted.scorable:
            return training_trace(dataclasses.replace(self.converted or _NOTHING, traces=[]))
        return training_trace(self.converted)

    def verify(self, transcript: list[Any], final_state: Any | None = None) -> Any:
        from openenv.core.harness import VerifyResult  # type: ignore[import-not-found]

        c = self.converted
        if c is None:
            return VerifyResult(env_reward=None, done=False, metrics={"tokentrail_rollout_id": self.rollout_id,
                                                                       "tokentrail_unscorable": ["no record"]})
        return VerifyResult(env_reward=c.reward if c.scorable else None, done=True, metrics={
            "tokentrail_rollout_id": c.rollout_id, "policy_version": c.policy_version, "policy_step": c.policy_step,
            "tokentrail_unscorable": list(c.unscorable), "tokentrail_excluded": list(c.excluded),
            "tokentrail_notes": list(c.notes)})

    def initial_messages(self) -> list[dict[str, Any]]:
        return [{"role": "user", "content": self.task if isinstance(self.task, str) else json.dumps(self.task)}]

    def list_tools(self) -> list[Any]:
        return []  # the harness owns its tools; the session serves none

    def call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        from openenv.core.harness import ToolResult

        return ToolResult(error=f"tool {name!r}: a tokentrail session serves no tools (the harness owns its loop)")

    def close(self) -> None:
        return None  # nothing held: the rollout is finished in wait_for_completion


class TokentrailSessionFactory:
    """Sessions against one interceptor; pass ``functools.partial(TokentrailSessionFactory, ...)`` to TRL.

    ``harness``: a module-level ``Callable[[HarnessRun], HarnessOutcome]``. ``records``: where delivered
    records are read (``RebuiltTopic(bootstrap)``). ``finish``: how a rollout is finished (default: the
    interceptor's finish route). ``versions``: ``{label: step}`` to order policy versions (else the
    consumer's ``oldest_policy_version``, step unknown). ``sampling``: TRL's training sampling, handed
    to the harness.
    """

    def __init__(self, *, interceptor_url: str, harness: Callable[[HarnessRun], HarnessOutcome],
                 records: RecordSource, finish: Callable[[str, HarnessOutcome], None] | None = None,
                 reward_key: str = "reward", timeout_s: float = 600.0, rollout_prefix: str = "trl",
                 versions: dict[str, int] | None = None, sampling: dict[str, Any] | None = None) -> None:
        self.interceptor_url, self.harness, self.records = interceptor_url, harness, records
        self.finish = finish or InterceptorFinish(interceptor_url)
        self.reward_key, self.timeout_s, self.rollout_prefix = reward_key, timeout_s, rollout_prefix
        self.versions, self.sampling = versions, sampling

    def create(self, task: Any, seed: int | None = None, episode_id: str | None = None) -> TokentrailSession:
        rollout_id = validate_rollout_id(f"{self.rollout_prefix}-{episode_id or uuid.uuid4().hex}")
        return TokentrailSession(self, rollout_id, task, seed)

    def version_book(self) -> VersionBook | None:
        if self.versions is None:
            return None
        return VersionBook(PolicyVersion(label=label, step=step) for label, step in self.versions.items())


class InterceptorFinish:
    """``POST {interceptor}/rollouts/<id>/finish`` with ``Authorization: Bearer $TOKENTRAIL_CONTROL_TOKEN``."""

    def __init__(self, interceptor_url: str, token_env: str = "TOKENTRAIL_CONTROL_TOKEN", timeout_s: float = 30.0):
        self.interceptor_url, self.token_env, self.timeout_s = interceptor_url, token_env, timeout_s

    def __call__(self, rollout_id: str, outcome: HarnessOutcome) -> None:
        token = os.environ.get(self.token_env)
        if not token:
            raise TransportError(f"finishing rollout {rollout_id}: ${self.token_env} is not set; set it to the "
                                 "interceptor's control token (its TOKENTRAIL_CONTROL_TOKEN)")
        body = json.dumps({"result": outcome.result, "final_text": outcome.final_text,
                           "final_response_id": outcome.final_response_id}).encode()
        request = urllib.request.Request(f"{self.interceptor_url.rstrip('/')}/rollouts/{rollout_id}/finish",
                                         data=body, method="POST", headers={
                                             "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                response.read()
        except OSError as exc:  # URLError and HTTPError are OSErrors
            raise TransportError(f"finishing rollout {rollout_id} at {self.interceptor_url}: {exc}") from exc
