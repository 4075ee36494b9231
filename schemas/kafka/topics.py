"""Topics: their names, their configs (one table), the record key and the startup check.

``TOPICS`` is the one table of every topic tokentrail uses: its ``TopicNames`` field, its
default name, its topic-level config and whether its partition count is fixed. What
`tokentrail topics` creates (``schemas.kafka.admin.ensure_topics``), what ``TopicNames.all()``
lists and what the startup check counts as standard all read it.

Every event of a rollout is keyed by the UTF-8 rollout id (`key_for`), so all of a
rollout's events land on one partition, in the order the producer acknowledged
them. Which partition, and every client setting that makes it so (the
``murmur2_random`` partitioner, ``acks=all``), is in ``schemas.kafka`` (``config``,
``partitioning``). Pure: standard library only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from schemas.errors import TokentrailError

DEFAULT_PARTITIONS = 4
# Rollout events are the replayable source of truth: keep them a week.
ROLLOUT_EVENTS_RETENTION_MS = 7 * 24 * 3600 * 1000
# Snapshots of long rollouts are large (delta-encoded token arrays); the topic
# and the producers are configured for this limit.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
_BIG = {"max.message.bytes": str(MAX_MESSAGE_BYTES)}


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """One topic: its ``TopicNames`` field, default name, topic-level config, fixed partition count."""

    field: str
    name: str
    config: Mapping[str, str]
    partitions: int | None = None  # None: as many as the deployment asks for (`--partitions`)


TOPICS: tuple[TopicSpec, ...] = (
    TopicSpec("rollout_events", "tokentrail.rollout-events", {"retention.ms": str(ROLLOUT_EVENTS_RETENTION_MS), **_BIG}),
    TopicSpec("snapshots", "tokentrail.snapshots", _BIG),
    TopicSpec("rebuilt", "tokentrail.rebuilt", _BIG),
    # Dead letters carry the undecodable event itself, so they can be as large as one.
    TopicSpec("deadletter", "tokentrail.deadletter", _BIG),
    # The trainer's announcements of policy versions: one record per label, the latest kept (compacted),
    # one partition so they are read in order.
    TopicSpec("policy_versions", "tokentrail.policy-versions", {"cleanup.policy": "compact"}, partitions=1),
    # Each interceptor's report of the version it applied, and its heartbeat (schemas.version_reports), keyed
    # by its instance id, the latest kept: what `tokentrail versions announce` waits on.
    TopicSpec("policy_versions_applied", "tokentrail.policy-versions-applied", {"cleanup.policy": "compact"},
              partitions=1),
    # The grouped trainer sink's output (consumers.sinks.kafka_groups): a group holds all its members' records.
    TopicSpec("rebuilt_groups", "tokentrail.rebuilt-groups", _BIG),
)
_SPECS = {spec.field: spec for spec in TOPICS}

ROLLOUT_EVENTS = _SPECS["rollout_events"].name
SNAPSHOTS = _SPECS["snapshots"].name
REBUILT = _SPECS["rebuilt"].name
DEADLETTER = _SPECS["deadletter"].name
POLICY_VERSIONS = _SPECS["policy_versions"].name
POLICY_VERSIONS_APPLIED = _SPECS["policy_versions_applied"].name
REBUILT_GROUPS = _SPECS["rebuilt_groups"].name


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicNames:
    """The topic names a deployment uses (configurable, these defaults; one field per ``TOPICS`` row)."""

    rollout_events: str = ROLLOUT_EVENTS
    snapshots: str = SNAPSHOTS
    rebuilt: str = REBUILT
    deadletter: str = DEADLETTER
    policy_versions: str = POLICY_VERSIONS
    policy_versions_applied: str = POLICY_VERSIONS_APPLIED
    rebuilt_groups: str = REBUILT_GROUPS

    def all(self) -> tuple[str, ...]:
        """Every topic name, in table order (what `tokentrail topics` creates and prints)."""
        return tuple(getattr(self, spec.field) for spec in TOPICS)

    def specs(self) -> dict[str, TopicSpec]:
        """Topic name (as configured here) -> its row of ``TOPICS``."""
        return {getattr(self, spec.field): spec for spec in TOPICS}


def partitions_of(spec: TopicSpec, partitions: int = DEFAULT_PARTITIONS) -> int:
    """The partition count ``spec`` is created with when the deployment asks for ``partitions``."""
    return spec.partitions if spec.partitions is not None else partitions


def applied_topic_of(policy_versions: str) -> str:
    """The reports topic that goes with a policy-versions topic (same prefix): ``<prefix>tokentrail.policy-versions-applied``."""
    return policy_versions.removesuffix(POLICY_VERSIONS) + POLICY_VERSIONS_APPLIED if policy_versions.endswith(
        POLICY_VERSIONS) else policy_versions + POLICY_VERSIONS_APPLIED.removeprefix(POLICY_VERSIONS)


def key_for(rollout_id: str) -> bytes:
    """The Kafka key of every event of ``rollout_id``."""
    return rollout_id.encode("utf-8")


def topic_names(prefix: str = "") -> TopicNames:
    """The default names, each prefixed (``"<prefix>tokentrail.rollout-events"``); isolates tests and tenants."""
    return TopicNames(**{spec.field: prefix + spec.name for spec in TOPICS})


def check_bootstrap(value: str) -> str:
    """A Kafka bootstrap list, ``host:port[,host:port]``; ValueError naming the value otherwise."""
    if not value or any(":" not in part for part in value.split(",")):
        raise ValueError(f"bootstrap must be host:port[,host:port], got {value!r}")
    return value


# ------------------------------------------------------------------ startup check
# The runtime processes never create topics: `tokentrail topics` is the one place that
# decides partition counts and topic configs (a topic auto-created with another partition
# count puts a rollout's events on another partition, breaking per-rollout order). They
# check at startup, for a bounded time, that the topics they read and write exist, and
# otherwise stop with this message instead of waiting for ever.

DEFAULT_TOPIC_WAIT_S = 10.0


def add_topic_options(parser: Any, *, wait: bool = True) -> None:
    """The topic flags every tokentrail process takes, spelt once: ``--topic-prefix`` and ``--topic-wait``."""
    parser.add_argument("--topic-prefix", default="", help="prefix of every topic name (isolation)")
    if wait:
        parser.add_argument("--topic-wait", type=float, default=DEFAULT_TOPIC_WAIT_S, metavar="SECONDS",
                            help="how long to wait at startup for the broker and the topics before exiting 4 "
                                 f"(default {DEFAULT_TOPIC_WAIT_S:g})")


class TopicsUnavailable(TokentrailError):
    """Topics a process needs are missing (or no broker answered) after the bounded startup wait."""

    def __init__(self, message: str, missing: tuple[str, ...]) -> None:
        super().__init__(message)
        self.missing = missing


def topic_prefix(names: TopicNames) -> str | None:
    """The prefix ``names`` were made with by `topic_names`, or None if they are not all of that form."""
    if not names.rollout_events.endswith(ROLLOUT_EVENTS):
        return None
    prefix = names.rollout_events.removesuffix(ROLLOUT_EVENTS)
    return prefix if topic_names(prefix) == names else None


def topics_command(bootstrap: str, names: TopicNames, partitions: int | None = None) -> str:
    """The `tokentrail topics` command line that creates ``names`` on ``bootstrap``."""
    parts = ["tokentrail", "topics", "--bootstrap", bootstrap]
    prefix = topic_prefix(names)
    if prefix:
        parts += ["--topic-prefix", prefix]
    if partitions is not None and partitions != DEFAULT_PARTITIONS:
        parts += ["--partitions", str(partitions)]
    return " ".join(parts)


def wait_for_topics(admin: Any, required: Iterable[str], *, bootstrap: str, names: TopicNames,
                    timeout: float = DEFAULT_TOPIC_WAIT_S, partitions: int | None = None,
                    sleep: Callable[[float], None] = time.sleep,
                    clock: Callable[[], float] = time.monotonic) -> None:
    """Return once every topic in ``required`` exists on the broker; `TopicsUnavailable` after ``timeout``.

    ``admin`` is anything with confluent-kafka's ``list_topics(timeout=...)`` (an AdminClient,
    Producer or Consumer); it is asked for the metadata of all topics, which never auto-creates
    one. A topic that exists but whose metadata carries an error (a leader not elected yet, just
    after creation) counts as missing until the error clears. The message names the missing
    topics and the `tokentrail topics` command that creates them (``names``/``partitions``: the
    topic names and partition count the caller was configured with).
    """
    wanted = list(dict.fromkeys(required))
    deadline = clock() + timeout
    answered, last_error, missing, errors = False, "", wanted, {}
    while True:
        try:
            metadata = admin.list_topics(timeout=max(0.1, min(2.0, deadline - clock())))
        except TokentrailError:  # final (the broker refused the credentials): waiting cannot help
            raise
        except Exception as exc:  # the client's own error type; this module imports no client
            last_error = f"{type(exc).__name__}: {exc}"
        else:
            if metadata.brokers:
                answered = True
                topics = metadata.topics
                missing = [t for t in wanted if t not in topics or topics[t].error is not None]
                if not missing:
                    return
                errors = {t: str(topics[t].error) for t in missing if t in topics}
        if clock() >= deadline:
            break
        sleep(min(0.25, max(0.0, deadline - clock())))
    if not answered:
        raise TopicsUnavailable(
            f"no Kafka broker answered at {bootstrap} within {timeout:g} s"
            + (f" ({last_error})" if last_error else "")
            + ": check --bootstrap, or start a broker (`tokentrail kafka up`) and create the topics with "
            f"`{topics_command(bootstrap, names, partitions)}`", tuple(wanted))
    standard = set(names.all()) if topic_prefix(names) is not None else set()
    others = [t for t in missing if t not in standard]
    listed = ", ".join(f"{t} ({errors[t]})" if t in errors else t for t in missing)
    many = len(missing) > 1
    message = (f"missing Kafka topic{'s' if many else ''} on {bootstrap} after waiting {timeout:g} s: {listed}. "
               f"Create {'them' if many else 'it'} with `{topics_command(bootstrap, names, partitions)}`")
    if others:
        message += f" (it creates only tokentrail's own topics: create {', '.join(others)} yourself)"
    raise TopicsUnavailable(message + ", then start this process again.", tuple(missing))
