"""The Kafka binding of the wire contract: how tokentrail's records travel on Kafka.

Pure (standard library only, importable anywhere): ``config`` (every producer,
consumer and admin client setting, built in one place), ``partitioning``
(Kafka's murmur2 partitioner, so a reader finds a rollout's partition),
``framing`` (what a record carries besides its Avro value: dead-letter headers,
the batch headroom under the topic limit) and ``topics`` (the one table of
topics, their configs, the record key and the startup check).

The Kafka client edge (the only ``schemas`` modules that import ``confluent_kafka``,
the ``kafka-edge`` import contract): ``bridge`` (the one acked producer and the
AdminClient factory), ``scan`` (reading a partition range, from an offset or a
time), ``versions`` (the policy-versions topic: announce, follow) and ``admin``
(creating the topics). This package imports none of them: a pure module reaches
the client only by importing an edge module by name, which the contract refuses.
"""
