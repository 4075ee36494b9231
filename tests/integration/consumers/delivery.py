"""Reading rollouts back as a trainer does: the in-process stream of a fresh consumer group."""

from __future__ import annotations

import asyncio
import uuid

from consumers.settings import ConsumerSettings
from consumers.trainer_stream import rollout_stream


async def consume(bootstrap: str, topics, wanted: set[str], timeout: float = 60.0) -> dict:
    """The delivered rollouts named in ``wanted``, by id, read by a new group; TimeoutError if any is missing."""
    settings = ConsumerSettings(bootstrap=bootstrap, group_id=f"itc-{uuid.uuid4().hex[:8]}", topics=topics,
                                poll_timeout_s=0.1)
    got: dict = {}
    async with asyncio.timeout(timeout), rollout_stream(settings) as stream:
        async for rollout in stream:  # the trainer, in the consumer's process
            if rollout.rollout_id in wanted:
                got[rollout.rollout_id] = rollout
            if set(got) == wanted:
                stream.ack()
                break
    return got
