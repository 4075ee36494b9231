"""What one harness attempt ended with: a final answer, or a failure with its class.

The one home of the collector's failure classes. A failure row (``tokentrail collect``'s
failures file) names its class; whether the collector tries the rollout again on a re-run
is decided here, by the class alone (``Failure.terminal``): a remote agent's invalid
Responses object or a verifier that raises will not fix itself on a retry; a crash, a
timeout or a service that is down may.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["FailureClass", "Failure", "HarnessOutcome", "TERMINAL_CLASSES"]


class FailureClass(StrEnum):
    """Why an attempt produced no rewarded rollout. Values are the strings in result rows; they never change."""

    HARNESS_CRASH = "harness_crash"        # the harness could not start, or died by a signal
    NONZERO_EXIT = "nonzero_exit"          # the CLI exited with a non-zero status
    TIMEOUT = "timeout"                    # a per-call or the per-rollout deadline passed
    INVALID_OUTPUT = "invalid_output"      # it ended without a final answer the collector can read
    TRANSPORT = "transport_error"          # a remote agent service unreachable or answering an HTTP error
    SCHEMA = "schema_error"                # a remote agent's reply is not a valid Responses object
    MAX_STEPS = "max_steps"                # no final message within --max-steps
    VERIFIER_ERROR = "verifier_error"      # the verifier raised (a custom verifier's bug)
    FINISH_ERROR = "finish_error"          # RolloutFinished could not be published
    DELIVERY_TIMEOUT = "delivery_timeout"  # finished, but its rebuilt record did not arrive in time


#: Classes never retried: the same input gives the same failure.
TERMINAL_CLASSES = frozenset({FailureClass.SCHEMA, FailureClass.VERIFIER_ERROR})


@dataclass(frozen=True, slots=True)
class Failure:
    failure_class: FailureClass
    detail: str  # what happened, for a person: the status, the exception, the end of the output

    @property
    def terminal(self) -> bool:
        return self.failure_class in TERMINAL_CLASSES


@dataclass(frozen=True, slots=True)
class HarnessOutcome:
    """What a harness handed back: text only (token ids are captured in the serving path).

    Exactly one of ``final_text`` and ``failure`` is meaningful: a failure means there is no
    answer to verify. ``final_response_id`` is the id of the response that carried the final
    answer as the harness saw it, when the harness reports one (terminal attribution).
    """

    final_text: str | None = None
    final_response_id: str | None = None
    failure: Failure | None = None
    steps: int = 0  # model turns (CLI) or agent-service steps (remote), as far as known

    @classmethod
    def failed(cls, failure_class: FailureClass, detail: str, *, steps: int = 0) -> HarnessOutcome:
        return cls(failure=Failure(failure_class, detail), steps=steps)
