"""The rebuild consumer's policy-staleness gate: the versions it follows, and the rule at delivery.

``follow`` (blocking; the consumer runs it once before its first poll) follows the
policy-versions topic with ``schemas.kafka.versions.VersionFollower`` and returns once
it has read the topic to its end: with ``max_staleness`` set always (a missing topic was
already refused by the topic check, as a required topic), otherwise only when the topic
exists, to report staleness. ``judge`` applies ``consumers.rebuild.staleness`` against the
version current at that moment, observes the ``/metrics`` histogram and counters, and
logs a drop. With no versions source, or none announced and no bound set, ``judge``
returns the rollout unchanged: the record stays byte-identical to a plain rebuild.

The follower folds announcements into its book on its own thread while ``judge`` reads
it: a label's step is written before the current version moves to it, so a reader never
sees a current version whose step it cannot look up.
"""

from __future__ import annotations

import logging
from typing import Any

from consumers.metrics import ConsumerMetrics
from consumers.rebuild.staleness import apply_staleness, check_staleness
from consumers.settings import ConsumerSettings
from schemas.errors import TransportError
from schemas.kafka.bridge import admin_client
from schemas.kafka.topics import TopicsUnavailable, topics_command
from schemas.policy_versions import VersionBook
from schemas.records import MaskCode, RebuiltRollout

__all__ = ["StalenessGate"]

log = logging.getLogger("tokentrail.consumer")


class StalenessGate:
    """``versions``: a ``VersionBook`` or anything with ``.book`` (a running follower); None: ``follow`` finds it."""

    def __init__(self, settings: ConsumerSettings, metrics: ConsumerMetrics, versions: Any = None) -> None:
        self.settings = settings
        self.metrics = metrics
        self._versions = versions
        self._follower: Any = None

    @property
    def book(self) -> VersionBook | None:
        versions = self._versions
        if versions is None or isinstance(versions, VersionBook):
            return versions
        return versions.book

    def follow(self) -> None:
        """Follow the policy-versions topic to its end; ``TopicsUnavailable`` when it cannot be read in time."""
        from schemas.kafka.versions import VersionFollower  # only a consumer that follows the topic needs it

        settings = self.settings
        topic = settings.topics.policy_versions
        if settings.max_staleness is None and not _topic_exists(settings.bootstrap, topic, security=settings.kafka):
            log.info("no topic %s: policy staleness is not reported", topic)
            return
        follower = VersionFollower(settings.bootstrap, topic, security=settings.kafka)
        try:
            follower.start()
        except TransportError as exc:
            if settings.max_staleness is not None:
                raise
            log.warning("policy staleness is not reported: %s", exc)  # gone since it was listed: report nothing
            return
        try:
            caught_up = follower.wait_caught_up(settings.topic_wait_s)
        except BaseException:
            follower.close()
            raise
        if caught_up is False:
            follower.close()
            raise TopicsUnavailable(
                f"could not read the policy-versions topic {topic} on {settings.bootstrap} to its end within "
                f"{settings.topic_wait_s:g} s (max_staleness={settings.max_staleness} needs it); check the broker, "
                f"or create the topic with `{topics_command(settings.bootstrap, settings.topics)}`", (topic,))
        self._follower = self._versions = follower
        if settings.max_staleness is not None and follower.book.current is None:
            log.warning("max_staleness=%d but %s holds no announcement yet: every rollout with generated tokens is "
                        "masked unknown_policy_version until a trainer announces a version", settings.max_staleness,
                        topic)

    def judge(self, rollout: RebuiltRollout) -> RebuiltRollout | None:
        """The rollout with its staleness (against the version current now); None: dropped as stale."""
        book = self.book
        limit = self.settings.max_staleness
        if book is None or (limit is None and not book.announcements):
            return rollout
        check = check_staleness(rollout, book)
        judged = apply_staleness(rollout, book, limit, self.settings.stale_action, check=check)
        if check.staleness is not None:
            self.metrics.staleness.observe(check.staleness)
        if judged is None:
            self.metrics.stale.labels(outcome="dropped").inc()
            log.info("dropped stale rollout %s (snapshot %s): staleness %s > max_staleness=%s, oldest version %r, "
                     "current %r", rollout.rollout_id, rollout.snapshot_id, check.staleness, limit, check.oldest,
                     check.current)
        elif len(judged.mask_reasons) > len(rollout.mask_reasons):
            stale = judged.mask_reasons[-1].code == MaskCode.STALE_POLICY
            self.metrics.stale.labels(outcome="masked" if stale else "unknown").inc()
        return judged

    def close(self) -> None:
        if self._follower is not None:
            self._follower.close()
            self._follower = None


def _topic_exists(bootstrap: str, topic: str, timeout: float = 5.0, *, security: Any = None) -> bool:
    """Whether ``topic`` exists (metadata of all topics: never auto-creates one); False when no broker answers."""
    try:
        return topic in admin_client(bootstrap, security=security).list_topics(timeout=timeout).topics
    except Exception:  # the client's own error type, or no broker: nothing to follow
        return False
