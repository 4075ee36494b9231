"""The thin Faust shell around the pure fold: decode, fold, store, emit, in batches.

Faust keeps the consumer group, the assignment, fetching, offset commits,
flow control around rebalances and the table (RocksDB, recovered from its
changelog). The rollout events themselves do not go through Faust's
per-record stream: the consumer's drain loop hands each fetch's rollout
events over as one batch (``processors.intake``), and the fold agent folds a
batch at a time (``processors.fold_loop``): one RocksDB write per partition,
its changelog records produced as record batches, one acker entry.

Guarantees, and the Faust behaviour each one rests on:

- At-least-once, in order, never ahead of the changelog. Faust runs
  ``at_least_once`` (its exactly-once mode has open duplicate and rebalance
  bugs). The agent produces its table's changelog records itself, acks events
  by hand, in order, each batch once Kafka has acknowledged its changelog
  records and outputs, and admits each partition's events only without holes
  (``processors.delivery``, ``processors.guard``: Faust's own
  flush-before-commit can commit past records it never sent, and around a
  rebalance its stream can drop fetched events). A batch's messages are
  tracked as unacked when the agent takes them, so a rebalance waits for
  their acks, as it waits for a stream's; a batch fetched under an earlier
  consumer generation, or taken while flow is suspended, is dropped unacked
  and fetched again. Redelivered events are
  recognised by their (partition, offset) against the position stored in the
  rollout's header (``processors.fold``), so they change nothing.
- Outputs before progress of their rollout. A snapshot or dead letter is
  acknowledged by Kafka before the next event of the same rollout is folded
  (other rollouts go on meanwhile) and before its event is acked; a crash
  before that leaves the event unacknowledged, and its redelivery emits the
  same bytes again (snapshot ids are deterministic). Snapshots may therefore
  arrive more than once; consumers are idempotent by snapshot identity.
- Local state never ahead of the changelog. RocksDB writes land at once, but
  their changelog records are produced asynchronously, so after ``kill -9`` the
  local store can hold writes the changelog never got; keeping them would make
  the redelivered events no-ops whose writes then never reach the changelog,
  and a later owner of the partition would rebuild a different state. So the
  data dir carries a marker while the worker runs; it is removed only after a
  clean stop (every event acked, producer flushed), and a worker that finds
  it at start discards the local tables and recovers them from the changelog.
- No silent wait for topics: before the worker starts, `check_topics` waits at
  most ``ProcessorSettings.topic_wait_s`` for rollout-events, snapshots and the
  dead-letter topic to exist, and otherwise raises ``TopicsUnavailable`` naming
  them and the `tokentrail topics` command (Faust would log "Ignoring missing
  topic" and wait for ever). The worker never creates them: their partition
  count is the per-rollout ordering contract, decided by `tokentrail topics`.
- Bounded resources: RocksDB memory per partition from
  ``ProcessorSettings.rocksdb``; the changelog is compacted (Faust's default
  for tables) and accepts messages up to ``MAX_MESSAGE_BYTES``, like the
  snapshots topic, so one large call body or snapshot fits.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from pathlib import Path
from typing import Any, cast

import faust
from faust.tables import TableManager
from faust.worker import Worker

from processors.delivery import DirectChangelogTable, OrderedAcker
from processors.fold_loop import FoldLoop
from processors.guard import OffsetGuard
from processors.intake import Intake
from processors.settings import ProcessorSettings
from schemas.kafka.security import KafkaSecurity
from schemas.kafka.topics import MAX_MESSAGE_BYTES, wait_for_topics

log = logging.getLogger("tokentrail.processor")

STATE_TABLE = "rollout-state"
# The changelog compacts only closed segments, and Kafka closes one at 1 GiB or after 7 days by default:
# an hour's soak left 643,000 records in one open segment per partition, every one of them read again by
# a worker recovering after kill -9 (110 s, against a live state of a few hundred keys). Segments of 16
# MiB (the largest record) closed at least every 10 minutes keep what a recovery reads near the live
# state plus the last 10 minutes. A changelog created before this keeps its old settings: alter it with
# kafka-configs (docs/deploying.md, "The processor").
CHANGELOG_CONFIG = {"max.message.bytes": str(MAX_MESSAGE_BYTES), "segment.bytes": str(MAX_MESSAGE_BYTES),
                    "segment.ms": str(10 * 60 * 1000)}
RUNNING_MARKER = "tokentrail-worker.running"


class DeclaredTables(TableManager):
    """Faust's table manager, started without its one-second sleep.

    Faust sleeps 1 s before subscribing the changelogs so that tables declared after the worker started
    still make it (``faust.tables.manager.TableManager.on_start``). Ours is declared in ``create_app``,
    before the worker starts, so the sleep only delayed every start and every restart after a crash.
    Adding a table later still fails as in Faust ("Too late to add tables"), once the channels are set.
    """

    async def on_start(self) -> None:
        if not self.should_stop:
            await self._update_channels()
            await self.recovery.start()


class ProcessorApp(faust.App):
    """A faust.App that records whether it stopped cleanly."""

    stopped_cleanly = False
    acker: OrderedAcker | None = None
    fetch_wait_ms = 1500  # the longest fetch long-poll (ProcessorSettings.fetch_wait_ms)
    tokentrail_table: DirectChangelogTable  # the fold's state table (create_app sets it)
    intake: Intake  # rollout-events batches for the fold agent (create_app sets it)

    def _new_consumer(self) -> Any:
        consumer: Any = super()._new_consumer()  # patched through private names below

        async def no_gaps(tp: Any, offset_from: int, offset_to: int) -> None:
            return None  # rollout-events is neither compacted nor transactional: a jump is a hole, not a gap

        consumer._add_gap = no_gaps  # see processors.delivery
        self.intake.install(consumer)  # rollout-events in batches, not through the stream (processors.intake)
        # faust builds its aiokafka consumer with fetch_max_wait_ms=1500, and aiokafka sends no fetch to a
        # broker that has one in flight: a partition whose records were still buffered when the long poll
        # went out is fetched again only when that poll returns, so its next event could wait 1.5 s.
        wait_ms = self.fetch_wait_ms
        thread = consumer._thread
        create = thread._create_worker_consumer

        def create_worker_consumer(transport: Any) -> Any:
            client = create(transport)
            client._fetch_max_wait_ms = wait_ms  # read by its fetcher, which start() creates
            return client

        thread._create_worker_consumer = create_worker_consumer
        return consumer

    async def on_stop(self) -> None:
        # faust's on_stop stops the consumer, waits for the streams and flushes the producer; if that
        # returned with every event acked, every local write is also in the changelog.
        await super().on_stop()
        self.stopped_cleanly = self.acker is None or self.acker.idle


class ProcessorWorker(Worker):
    """Faust's worker (it owns the event loop, signals and shutdown) without its one-second stop.

    After the loop stopped, mode's worker runs a task that sleeps 1 s before closing it
    (``mode.worker.Worker._sentinel_task``); by then ``ProcessorApp.on_stop`` has flushed the producer,
    acked or dropped every event and closed RocksDB, so the second only delayed every clean stop. One
    pass of the loop still runs what the stop scheduled last.
    """

    def __init__(self, app: ProcessorApp, *, loglevel: str) -> None:
        super().__init__(app, loglevel=loglevel, quiet=True)
        # faust's startup spinner sets the root logger to DEBUG for good, so every debug call in
        # aiokafka and faust builds a log record: about 6% of a busy worker's time.
        self.spinner = None

    async def _sentinel_task(self) -> None:
        await asyncio.sleep(0)


def create_app(settings: ProcessorSettings) -> ProcessorApp:
    p = settings.partitions
    app = ProcessorApp(
        settings.app_id,
        broker=[f"kafka://{b}" for b in settings.bootstrap.split(",")],
        store="rocksdb://",
        datadir=str(settings.data_dir),
        processing_guarantee="at_least_once",
        topic_partitions=p,
        topic_replication_factor=1,
        table_standby_replicas=0,
        consumer_auto_offset_reset="earliest",
        web_enabled=settings.web_port is not None,
        web_port=settings.web_port or 6066,
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=settings.heartbeat_interval_s,
        broker_rebalance_timeout=settings.rebalance_timeout_s,
        broker_commit_interval=settings.commit_interval_s,
        producer_max_request_size=MAX_MESSAGE_BYTES,
        consumer_max_fetch_size=MAX_MESSAGE_BYTES,
        producer_acks=-1,
        producer_linger=settings.producer_linger_s,
        producer_max_batch_size=settings.producer_max_batch_bytes,
        Table=DirectChangelogTable,
        TableManager=DeclaredTables,
        broker_credentials=faust_credentials(settings.kafka),
    )
    app.fetch_wait_ms = settings.fetch_wait_ms
    raw: dict[str, Any] = dict(key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw",
                               partitions=p)
    events = app.topic(settings.topics.rollout_events, **raw)
    snapshots = app.topic(settings.topics.snapshots, **raw)
    deadletter = app.topic(settings.topics.deadletter, **raw)
    table = cast(DirectChangelogTable,  # the app's Table class
                 app.Table(STATE_TABLE, default=None, partitions=p, key_type=bytes, value_type=bytes,
                           options=settings.rocksdb.as_options(),
                           extra_topic_configs=CHANGELOG_CONFIG))
    # Tables derive serializers from their types (json for bytes); state values are our own Avro bytes.
    table.key_serializer = "raw"
    table.value_serializer = "raw"

    intake = app.intake = Intake(app, settings.topics.rollout_events)

    @app.agent(events, name="fold")
    async def fold_agent(stream: faust.StreamT[bytes]) -> None:
        acker = app.acker = OrderedAcker(app, table)
        guard = OffsetGuard(app, settings.topics.rollout_events, reseek_s=settings.hole_check_interval_s)
        loop = FoldLoop(table, acker, guard, snapshots, deadletter)
        acker.start()
        guard.start()
        batches = asyncio.ensure_future(_fold_batches(intake, loop))
        try:
            # The stream subscribes the topic. With the intake's drain installed (a worker), Faust delivers
            # nothing through it; without (agent.test_context()), every event, folded as a batch of one.
            async for event in cast("faust.Stream[bytes]", stream).noack().events():
                await loop.fold(intake.admit([event.message]))
        finally:
            batches.cancel()
            loop.count.log()
            guard.stop()
            acker.stop()

    app.tokentrail_table = table
    return app


def faust_credentials(security: KafkaSecurity) -> faust.types.auth.CredentialsT | None:
    """Faust's credentials for ``security``, from its aiokafka translation (``KafkaSecurity.aiokafka_auth``).

    OAUTHBEARER: ``faust.OAuthCredentials`` around an OIDC token provider (``processors.oauth``), which
    fetches its first token when aiokafka first connects. KafkaConfigError for TLS files that do not load.
    """
    if not security.secured:
        return None
    if security.mechanism == "OAUTHBEARER":
        # Imported here: only an OAUTHBEARER processor loads httpx (the others start as fast as before).
        from processors.oauth import OidcTokenProvider

        provider = OidcTokenProvider.of(security)
        auth = security.aiokafka_auth(token_provider=provider)
        return faust.OAuthCredentials(oauth_cb=provider, ssl_context=auth.get("ssl_context"))
    auth = security.aiokafka_auth()
    if not security.sasl:
        return faust.SSLCredentials(auth["ssl_context"])
    return faust.SASLCredentials(username=auth["sasl_plain_username"], password=auth["sasl_plain_password"],
                                 ssl_context=auth.get("ssl_context"), mechanism=auth["sasl_mechanism"])


async def _fold_batches(intake: Intake, loop: FoldLoop) -> None:
    """Fold what the intake's drain loop fetched, batch after batch."""
    while True:
        await loop.fold(await intake.take())


def required_topics(settings: ProcessorSettings) -> list[str]:
    """The topics the worker reads (rollout-events) and writes (snapshots, dead letters)."""
    return [settings.topics.rollout_events, settings.topics.snapshots, settings.topics.deadletter]


def check_topics(settings: ProcessorSettings, *, admin: Any = None) -> None:
    """Return once `required_topics` exist; ``TopicsUnavailable`` after ``settings.topic_wait_s``.

    ``admin`` replaces the confluent-kafka AdminClient (tests).
    """
    if admin is None:
        # Imported here: the Faust worker needs confluent_kafka only for this startup check.
        from schemas.kafka.bridge import admin_client

        admin = admin_client(settings.bootstrap, security=settings.kafka)  # quiet: the outcome reaches the caller, not librdkafka's log
    wait_for_topics(admin, required_topics(settings), bootstrap=settings.bootstrap, names=settings.topics,
                    timeout=settings.topic_wait_s, partitions=settings.partitions)


def claim_local_state(app: faust.App) -> bool:
    """Mark the data dir in use; discard local tables a previous run left unclean. True if it discarded."""
    marker = Path(app.conf.datadir) / RUNNING_MARKER
    tabledir = Path(app.conf.tabledir)
    discarded = marker.exists() and tabledir.exists()
    if discarded:
        log.warning("the previous worker on %s did not stop cleanly: discarding its local tables, they are "
                    "recovered from the changelog", app.conf.datadir)
        shutil.rmtree(tabledir)
    marker.parent.mkdir(parents=True, exist_ok=True)
    with open(marker, "w") as fh:
        fh.write(f"{os.getpid()}\n")
        fh.flush()
        os.fsync(fh.fileno())
    return discarded


def release_local_state(app: ProcessorApp) -> bool:
    """Remove the marker if the app stopped cleanly; True if it did."""
    if not app.stopped_cleanly:
        return False
    (Path(app.conf.datadir) / RUNNING_MARKER).unlink(missing_ok=True)
    return True

