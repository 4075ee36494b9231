"""The wire contract and the shared pure domain of tokentrail.

What the events are (``avro/*.avsc``, ``records``), how they travel
(``codec``: Avro single-object encoding; ``topics``: names and keys), and the
hashes that cross processes (``hashing``, byte-compatible with NeMo Gym).

Imports only the standard library and fastavro; ``tests/unit/test_architecture.py``
checks that in a fresh interpreter. The exception is the Kafka binding's two client
edges, ``kafka.bridge`` and ``kafka.scan`` (confluent_kafka), which this package never
imports: ``schemas.kafka`` itself and its other modules stay pure.
"""
