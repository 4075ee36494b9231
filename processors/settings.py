"""ProcessorSettings: the one typed settings model of the fold processor, validated before any I/O."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainSerializer, PlainValidator, WithJsonSchema

from schemas.kafka.config import DEFAULT_FETCH_WAIT_MS
from schemas.kafka.security import KafkaSecurity, kafka_security_of
from schemas.kafka.topics import DEFAULT_PARTITIONS, DEFAULT_TOPIC_WAIT_S, TopicNames, check_bootstrap

Bootstrap = Annotated[str, AfterValidator(check_bootstrap)]
# The process's Kafka security (schemas.kafka.security): a client config file path, parsed once, validated here.
KafkaClient = Annotated[KafkaSecurity, PlainValidator(kafka_security_of), PlainSerializer(KafkaSecurity.describe),
                        WithJsonSchema({"type": "string", "description": "client config file (--kafka-config)"})]


class RocksDBMemory(BaseModel):
    """RocksDB memory per partition DB. Faust's defaults are 2 GiB of block cache per partition."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    block_cache_size: int = 64 << 20
    write_buffer_size: int = 8 << 20
    max_write_buffer_number: int = 2
    max_open_files: int = 256

    def as_options(self) -> dict[str, int]:
        return self.model_dump()


class ProcessorSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    bootstrap: Bootstrap
    kafka: KafkaClient = Field(KafkaSecurity(), description="TLS / SASL of every Kafka client of the process: "
                               "--kafka-config FILE or env TOKENTRAIL_KAFKA_CONFIG (schemas.kafka.security)")
    data_dir: Path = Field(Path(".tokentrail/processor"), description="Per-worker RocksDB directory (one per process)")
    app_id: str = Field("tokentrail-processor", description="Consumer group id and changelog topic prefix")
    partitions: int = Field(DEFAULT_PARTITIONS, ge=1)
    topics: TopicNames = TopicNames()
    rocksdb: RocksDBMemory = RocksDBMemory()
    # Short group timeouts make (re)joins take seconds rather than a minute.
    session_timeout_s: float = 10.0
    heartbeat_interval_s: float = 1.0
    rebalance_timeout_s: float = 10.0
    commit_interval_s: float = 1.0
    # Every event writes about four table keys, each a changelog record: a short linger and room in a
    # batch let them share produce requests (a snapshot send waits at most the linger).
    producer_linger_s: float = Field(0.005, ge=0)
    producer_max_batch_bytes: int = Field(1 << 20, ge=16 << 10)
    # The longest a fetch waits at the broker for records. aiokafka sends one fetch per broker at a time, so
    # a partition left out of the poll in flight (its records were still buffered) waits for that poll to
    # return: this bounds the delay of its next event, at one empty fetch per interval when idle.
    fetch_wait_ms: int = Field(DEFAULT_FETCH_WAIT_MS, ge=1, le=1500, description="Longest fetch long-poll (faust's own is 1500)")
    web_port: int | None = Field(None, description="Faust's web server (metrics); off unless set")
    hole_check_interval_s: float = Field(1.0, gt=0, description="How often the offset guard repeats its "
                                         "rewinds and looks for a hole at a quiet partition's tail")
    topic_wait_s: float = Field(DEFAULT_TOPIC_WAIT_S, ge=0, description="How long startup waits for the broker "
                                "and for the topics the worker reads and writes to exist before it gives up")
