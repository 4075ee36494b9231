"""The rebuild consumer in a trainer's own event loop, feeding it a ``RolloutStream``.

``rollout_stream(settings, **stream_kwargs)`` starts ``consumers.loop.RebuildConsumer`` as a task
of the caller's event loop with a ``consumers.sinks.stream.RolloutStream`` (built from
``stream_kwargs``: grouping, timeouts) as its sink, and yields the stream. Leaving the context
stops the consumer and closes it; a consumer that stops with an error (a failed retire,
``MaskFractionExceeded``) makes the trainer's iteration raise it.

    async with rollout_stream(settings, group_key="group_id", group_size="group_size") as stream:
        async for group in stream:
            train_on(group)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from consumers.loop import RebuildConsumer
from consumers.settings import ConsumerSettings
from consumers.sinks.stream import RolloutStream

__all__ = ["rollout_stream"]


@asynccontextmanager
async def rollout_stream(settings: ConsumerSettings, *, kafka_clients: dict[str, Any] | None = None,
                         **stream_kwargs: Any) -> AsyncIterator[RolloutStream]:
    """A ``RolloutStream`` fed by a rebuild consumer running in this event loop (see the module docstring).

    ``kafka_clients`` (``kafka_consumer``/``kafka_producer``) replace the Kafka clients, for tests.
    """
    stream = RolloutStream(**stream_kwargs)
    consumer = RebuildConsumer(settings, stream, **(kafka_clients or {}))
    stop = asyncio.Event()

    async def feed() -> None:
        try:
            await consumer.run(stop=stop)
        except Exception as exc:  # surfaced to the trainer through the iteration
            await stream.fail(exc)
            raise

    task = asyncio.create_task(feed())
    try:
        yield stream
    finally:
        stop.set()
        try:
            await task
        finally:
            await consumer.close()
