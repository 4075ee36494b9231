"""tokentrail as TRL's rollout source: delivered records as OpenEnv training traces and GRPO rows.

An optional plugin of the consumer side (``pip install tokentrail[trl]``); no core module imports
it (the ``trl-source-optional`` import contract). This package's top level and ``convert`` are
pure and import neither TRL, OpenEnv nor torch; ``session`` (an OpenEnv ``TrainableSession`` and
its factory, for TRL's ``HarnessRolloutWorker``) imports OpenEnv, ``rollout_func`` (for
``trl.GRPOTrainer(rollout_func=...)``) is built on the same session, and ``records`` waits for a
delivered record on the Kafka sink's topic. The mapping: docs/trainer-authors.md, "TRL and OpenEnv".
"""

from consumers.trl_source.convert import ConversionError, ConvertedRollout, ConvertedTrace, TurnData, convert_rollout

__all__ = ["ConversionError", "ConvertedRollout", "ConvertedTrace", "TurnData", "convert_rollout"]
