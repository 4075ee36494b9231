"""Rollout events from the consumer's fetches to the fold agent in batches (used by ``processors.app``).

Faust hands each fetched record to its stream one at a time: the consumer's
drain loop wraps every record's delivery in ``wait_first`` (four tasks and an
``asyncio.wait``), then the conductor takes a lock, decodes it into an event
and queues it, and the stream iterator tracks it, runs the sensors and yields
it. On a busy worker that was about 200 us of a 2-core machine's CPU per
event, more than the fold; a 10,000 events/s worker has 100 us for everything.

``Intake`` keeps Faust's consumer (group membership, assignment, fetching,
commits, table recovery, flow control) and replaces that per-record path for
the rollout-events topic only:

- ``install(consumer)`` gives the consumer a drain loop that is Faust's own
  (``Consumer._drain_messages`` of the pinned faust: read offsets, dropped
  re-reads, gaps, commit_every, a yield every 100 records), except that a
  rollout-events message is appended to the fetch's batch instead of being
  delivered; records of other topics (the changelog while a table recovers)
  still go through ``callback``, with Faust's ``wait_first``. A fetch's batch
  is queued once, and, like Faust's deliveries, abandoned when flow is
  suspended (a rebalance): nothing of it was tracked or acked, so its
  messages are fetched again from the committed offsets.
- The queue is a ``FlowControlQueue`` on ``app.flow_control``, like a
  stream's: cleared when partitions are revoked and when flow resumes, and
  bounded (back pressure on the drain loop).
- ``take()`` returns the next batch, without the messages a stream would have
  skipped (flow suspended, or fetched under an earlier consumer generation;
  never acked, so never committed), each admitted message tracked as unacked
  (``consumer.unacked``), so a rebalance waits for its ack as for a stream's.
- The fold agent still iterates its own stream (which is what subscribes the
  topic): Faust delivers nothing through it in a worker whose consumer has the
  drain installed, and every event under ``agent.test_context()``, folded as
  a batch of one after ``admit``.
"""

from __future__ import annotations

import asyncio
import logging
import types
from typing import TYPE_CHECKING, Any

import faust
from mode.utils.queues import FlowControlQueue

if TYPE_CHECKING:
    from faust.transport.consumer import Consumer

log = logging.getLogger("tokentrail.processor")

Batch = list[Any]  # faust Messages of rollout-events, in fetch order


class Intake:
    """Batches of rollout-events messages for the fold agent (see the module docstring)."""

    def __init__(self, app: faust.App, topic: str, maxsize: int = 16) -> None:
        self._app, self.topic = app, topic
        self._queue: FlowControlQueue[Batch] = FlowControlQueue(maxsize, flow_control=app.flow_control,
                                                                clear_on_resume=True)
        self.installed = False

    def install(self, consumer: Any) -> None:
        """Give ``consumer`` the drain loop that queues rollout-events fetches as batches."""
        consumer._drain_messages = types.MethodType(_drain_messages, consumer)
        consumer.tokentrail_intake = self
        self.installed = True

    async def put(self, batch: Batch) -> None:
        await self._queue.put(batch)

    async def take(self) -> Batch:
        """The next batch: admitted messages only, each tracked as unacked (see the module docstring)."""
        while True:
            batch = self.admit(await self._queue.get())
            if batch:
                return batch

    def admit(self, batch: Batch) -> Batch:
        """The messages a stream would not skip (flow active, this consumer generation), tracked as unacked."""
        app = self._app
        if not app.flow_control.is_active():
            return []
        generation = app.consumer_generation_id
        unacked = app.consumer.unacked
        admitted = []
        for message in batch:
            if message.generation_id == generation:
                unacked.add(message)
                admitted.append(message)
        return admitted


async def _drain_messages(consumer: Consumer, fetcher: Any) -> None:  # pragma: no cover - a worker's loop
    """faust-streaming 0.15.3's ``Consumer._drain_messages`` (BSD licence), batching rollout-events.

    The one change: a rollout-events message joins the fetch's batch instead of going through
    ``wait_first(callback(message), suspend_flow.wait())``; the batch is queued once per fetch.
    """
    intake: Intake = consumer.tokentrail_intake  # type: ignore[attr-defined]
    topic = intake.topic
    callback = consumer.callback
    getmany = consumer.getmany
    get_read_offset = consumer._read_offset.__getitem__
    set_read_offset = consumer._read_offset.__setitem__
    set_flag, unset_flag = consumer.diag.set_flag, consumer.diag.unset_flag
    commit_every = consumer._commit_every
    acks_enabled_for = consumer.app.topics.acks_enabled_for
    yield_every, num_since_yield = 100, 0
    sleep = asyncio.sleep
    try:
        while not (consumer.should_stop or fetcher.should_stop):
            set_flag("FETCHING")
            ait = getmany(timeout=1.0)
            # Sleeping because sometimes getmany is called in a loop never releasing to the event loop
            await consumer.sleep(0)
            batch: Batch = []
            if not consumer.should_stop:
                async for tp, message in ait:
                    num_since_yield += 1
                    if num_since_yield > yield_every:
                        await sleep(0)
                        num_since_yield = 0
                    offset = message.offset
                    r_offset = get_read_offset(tp)
                    if r_offset is None or offset >= r_offset:
                        gap = offset - (r_offset or 0)
                        if gap > 1 and r_offset and acks_enabled_for(message.topic):
                            await consumer._add_gap(tp, r_offset + 1, offset)
                        if commit_every is not None and consumer._n_acked >= commit_every:
                            consumer._n_acked = 0
                            await consumer.commit()
                        if tp.topic == topic:
                            batch.append(message)
                        else:
                            await consumer.wait_first(callback(message), consumer.suspend_flow.wait())
                        set_read_offset(tp, offset)
                unset_flag("FETCHING")
            if batch:
                await consumer.wait_first(intake.put(batch), consumer.suspend_flow.wait())
    except consumer.consumer_stopped_errors:
        if consumer.app.should_stop:
            log.info("Broker stopped consumer, shutting down...")
            return
        raise
    except asyncio.CancelledError:
        if consumer.app.should_stop:
            log.info("Consumer shutting down for user cancel.")
            return
        raise
    except Exception as exc:
        log.exception("Drain messages raised: %r", exc)
        raise
    finally:
        unset_flag("FETCHING")
