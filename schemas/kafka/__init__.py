"""The Kafka binding of the wire contract: how tokentrail's records travel on Kafka.

Pure (standard library only, importable anywhere): ``config`` (every producer,
consumer and admin client setting, built in one place), ``partitioning``
(Kafka's murmur2 partitioner, so a reader finds a rollout's partition) and
``framing`` (what a record carries besides its Avro value: dead-letter headers,
the batch headroom under the topic limit).

Framework edges (the only ``schemas`` modules that import ``confluent_kafka``):
``bridge`` (the one acked producer and the AdminClient factory) and ``scan``
(reading a partition range, from an offset or a time). They are never imported
by this package itself, so ``import schemas.kafka.config`` stays framework-free;
the names below resolve lazily for convenience.
"""

from schemas.surface import lazy_surface

__all__, __getattr__ = lazy_surface(__name__, {
    "AckedProducer": "schemas.kafka.bridge",
    "PublishFailed": "schemas.kafka.bridge",
    "admin_client": "schemas.kafka.bridge",
    "TopicReader": "schemas.kafka.scan",
})
