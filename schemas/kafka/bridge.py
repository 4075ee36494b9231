"""The one acked Kafka producer of tokentrail, and the AdminClient factory.

``AckedProducer`` wraps confluent-kafka's synchronous ``Producer`` (configured by
``schemas.kafka.config.producer_config``) and offers three ways to send, all of
which return only once the broker acknowledged (``acks=all``) and raise
``PublishFailed`` (a ``TransportError``) otherwise:

- ``await produce(...)``: asyncio; a poll thread (started on first use) resolves
  the future from the delivery callback, about a millisecond per acknowledged
  record (``reference/stack.md`` §3; awaiting ``AIOProducer`` sends one by one
  takes seconds). The interceptor, the Kafka sink and the Gym adapters use it.
- ``produce_sync(...)``: blocking produce-and-wait, for worker threads (the
  consumer's retire and dead-letter path).
- ``produce_all(...)``: blocking, many records in order with back-pressure
  (compose, benchmarks, tests).

The three paths hand librdkafka the same topic, key, value and headers, so they
write byte-identical records. Lost acks are classified once (`classify`): a
failure after which the record certainly never reached a broker is
``possibly_persisted=False``; one no retry can fix is ``permanent``; every other
failure, a message timeout included, may have been persisted (its ack was lost),
so whoever retries must check first (``producers.capture.durable``). One close policy:
``close`` flushes for at most the producer's delivery timeout (past it
librdkafka has failed every queued record anyway) and returns how many records
were left unflushed.

With ``schemas.kafka.scan`` this is the only ``schemas`` module that imports a
framework (ARCHITECTURE §3).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

import confluent_kafka
from confluent_kafka.admin import AdminClient

from schemas.errors import TransportError
from schemas.kafka.config import admin_config, delivery_timeout_s
from schemas.kafka.security import KafkaSecurity

__all__ = ["AckedProducer", "PublishFailed", "KafkaAuthFailed", "classify", "admin_client", "check_credentials"]

Headers = list[tuple[str, bytes]] | None


class PublishFailed(TransportError):
    """Kafka did not acknowledge a record. ``possibly_persisted``: the broker may hold it anyway
    (its ack was lost), so whoever retries must check before publishing it again. ``permanent``:
    no retry can succeed (the record is too large, an argument is invalid, the producer is closed)."""

    def __init__(self, message: str, *, possibly_persisted: bool, permanent: bool = False) -> None:
        super().__init__(message)
        self.possibly_persisted = possibly_persisted
        self.permanent = permanent


# Errors after which the record certainly never reached a broker.
# (The Python client does not expose librdkafka's per-message persistence status, so
# every other failure, a message timeout included, counts as possibly persisted.)
_NOT_SENT = {confluent_kafka.KafkaError._TIMED_OUT_QUEUE, confluent_kafka.KafkaError._PURGE_QUEUE}
# Errors no retry can fix (an ACL refusal too: the broker never wrote the record).
_DENIED = {confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED, confluent_kafka.KafkaError.CLUSTER_AUTHORIZATION_FAILED,
           confluent_kafka.KafkaError._AUTHENTICATION}
_PERMANENT = {confluent_kafka.KafkaError.MSG_SIZE_TOO_LARGE, confluent_kafka.KafkaError._INVALID_ARG, *_DENIED}


def classify(err: Any, message: str) -> PublishFailed:
    """``PublishFailed`` for a delivery error ``err`` (a ``KafkaError``; anything else counts as possibly persisted)."""
    code = err.code() if callable(getattr(err, "code", None)) else None
    if code in _DENIED:
        message += ("; this process's Kafka principal (sasl.username of its --kafka-config) may not write the "
                    "topic: grant it WRITE on it (the ACL table in docs/deploying.md), or use the right role's config")
    return PublishFailed(message, possibly_persisted=code not in _NOT_SENT and code not in _PERMANENT,
                         permanent=code in _PERMANENT)


class KafkaAuthFailed(TransportError):
    """The broker refused this client's credentials or its TLS handshake: no retry can succeed.

    Raised at start (`check_credentials`, and by an `admin_client`'s ``list_topics``), instead of
    waiting for a broker that will never let the process in.
    """


# librdkafka reports a refused SASL login and a failed TLS handshake through the error callback only;
# a request just waits for its timeout. These codes are final: the credentials or certificates are wrong.
_AUTH_CODES = {confluent_kafka.KafkaError._AUTHENTICATION, confluent_kafka.KafkaError._SSL}


class _AuthWatch:
    """The error callback of a client: keeps the first authentication or TLS failure."""

    def __init__(self) -> None:
        self.error: Any = None

    def __call__(self, err: Any) -> None:
        if self.error is None and err.code() in _AUTH_CODES:
            self.error = err


def auth_failure(bootstrap: str, security: KafkaSecurity | None, err: Any) -> KafkaAuthFailed:
    """The message of a refused login or TLS handshake: who tried, and which settings to check."""
    sec = security or KafkaSecurity()
    where = f" in {sec.source}" if sec.source else ""
    text = err.str() if callable(getattr(err, "str", None)) else str(err)
    if getattr(err, "code", lambda: None)() == confluent_kafka.KafkaError._SSL:
        fix = (f"check ssl.ca.location (the CA that signed the broker's certificate), ssl.certificate.location "
               f"and ssl.key.location{where}")
    else:
        fix = f"check sasl.mechanism, sasl.username and sasl.password{where} (the password is not shown)"
    return KafkaAuthFailed(f"Kafka at {bootstrap} refused {sec.describe()}: {text}; {fix}")


class _Admin:
    """An AdminClient whose ``list_topics`` raises `KafkaAuthFailed` once the broker refused the login."""

    def __init__(self, client: Any, watch: _AuthWatch, bootstrap: str, security: KafkaSecurity | None) -> None:
        self._client, self._watch, self._bootstrap, self._security = client, watch, bootstrap, security

    def list_topics(self, *args: Any, **kwargs: Any) -> Any:
        self._raise_if_refused()
        try:
            return self._client.list_topics(*args, **kwargs)
        except confluent_kafka.KafkaException:
            self._raise_if_refused()
            raise

    def _raise_if_refused(self) -> None:
        self._client.poll(0)  # serves the error callback
        if self._watch.error is not None:
            raise auth_failure(self._bootstrap, self._security, self._watch.error)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def admin_client(bootstrap: str, *, security: KafkaSecurity | None = None,
                 extra: Mapping[str, Any] | None = None) -> Any:
    """An AdminClient for ``bootstrap`` (``admin_config``: quiet log, quick reconnect); TransportError if refused.

    ``security``: the process's `KafkaSecurity`. Its ``list_topics`` raises `KafkaAuthFailed` once the
    broker refused the credentials (the plain client would time out as if no broker answered).
    """
    watch = _AuthWatch()
    try:
        client = AdminClient(admin_config(bootstrap, security=security, extra={"error_cb": watch, **(extra or {})}))
    except confluent_kafka.KafkaException as exc:
        raise TransportError(f"cannot create a Kafka admin client for {bootstrap}: {exc}") from exc
    return _Admin(client, watch, bootstrap, security)


def check_credentials(bootstrap: str, security: KafkaSecurity | None, *, timeout_s: float = 10.0) -> bool:
    """True once the broker answered metadata with these credentials; False if none answered in ``timeout_s``.

    `KafkaAuthFailed` as soon as the broker refused the login or the TLS handshake (no waiting out the timeout).
    """
    admin = admin_client(bootstrap, security=security)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if admin.list_topics(timeout=max(0.1, min(1.0, deadline - time.monotonic()))).brokers:
                return True
        except confluent_kafka.KafkaException:
            pass
        if time.monotonic() >= deadline:
            admin._raise_if_refused()
            return False


class AckedProducer:
    """Produce and wait for ``acks=all``; see the module docstring.

    ``config`` is a ``producer_config``; ``client`` replaces the confluent-kafka ``Producer``
    (tests: anything with ``produce(topic, key=, value=, headers=, on_delivery=)``, ``flush``
    and, for the async path and back-pressure, ``poll``).
    """

    def __init__(self, config: Mapping[str, Any] | None = None, *, client: Any = None,
                 name: str = "tokentrail-acked-producer") -> None:
        if client is None:
            if config is None:
                raise ValueError("AckedProducer needs a producer_config or a client")
            try:
                client = confluent_kafka.Producer(dict(config))
            except confluent_kafka.KafkaException as exc:
                raise TransportError(f"cannot create the Kafka producer for "
                                     f"{config.get('bootstrap.servers')}: {exc}") from exc
        self._client = client
        self._timeout_s = delivery_timeout_s(config) if config is not None else 30.0
        self._name = name
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None
        self._lock = threading.Lock()
        self.closed = False

    # -- the three send paths ---------------------------------------------------------------
    async def produce(self, topic: str, key: bytes | None, value: bytes,
                      headers: Headers = None) -> tuple[int, int]:
        """Produce one record; ``(partition, offset)`` once acknowledged by all in-sync replicas."""
        self._check_open(topic)
        self._start_poller()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[tuple[int, int]] = loop.create_future()

        def on_delivery(err: Any, msg: Any) -> None:
            def resolve() -> None:
                if future.done():
                    return
                if err is not None:
                    future.set_exception(classify(err, f"publish to {topic} was not acknowledged: {err}"))
                else:
                    future.set_result(_position(msg))

            loop.call_soon_threadsafe(resolve)

        while not self._try_produce(topic, key, value, headers, on_delivery):
            await asyncio.sleep(0.005)  # local queue full: back-pressure the caller
        return await future

    def produce_sync(self, topic: str, key: bytes | None, value: bytes, headers: Headers = None, *,
                     timeout_s: float | None = None) -> tuple[int, int]:
        """Blocking `produce`: ``(partition, offset)`` once acknowledged, else ``PublishFailed``."""
        self._check_open(topic)
        outcome: list[tuple[Any, Any]] = []
        while not self._try_produce(topic, key, value, headers, lambda err, msg: outcome.append((err, msg))):
            self._make_room()
        self._client.flush(self._wait_s(timeout_s))  # serves the delivery callback (or the poll thread does)
        if not outcome:
            raise PublishFailed(f"publish to {topic} was not acknowledged: timeout", possibly_persisted=True)
        err, msg = outcome[0]
        if err is not None:
            raise classify(err, f"publish to {topic} was not acknowledged: {err}")
        return _position(msg)

    def produce_all(self, topic: str, records: Iterable[tuple[bytes | None, bytes]], *,
                    timeout_s: float | None = None) -> int:
        """Produce ``(key, value)`` records in order, waiting for room when the local queue is full.

        Returns how many were acknowledged (all of them); otherwise ``PublishFailed`` with the first
        delivery error and the error count, or the number still unacknowledged after ``timeout_s``.
        """
        self._check_open(topic)
        errors: list[Any] = []
        sent = 0

        def on_delivery(err: Any, _msg: Any) -> None:
            if err is not None:
                errors.append(err)

        for key, value in records:
            while not self._try_produce(topic, key, value, None, on_delivery):
                self._make_room()
            sent += 1
            self._client.poll(0)  # serve callbacks as we go, so the queue drains while we fill it
        wait = self._wait_s(timeout_s)
        left = self._client.flush(wait)
        if errors:
            str_of = getattr(errors[0], "str", None)
            first = str_of() if callable(str_of) else str(errors[0])
            failed = classify(errors[0], f"producing to {topic} failed: {first} ({len(errors)} delivery errors)")
            raise failed
        if left:
            raise PublishFailed(f"producing to {topic} failed: {left} records unacknowledged after {wait:.0f} s "
                                f"(0 delivery errors)", possibly_persisted=True)
        return sent

    # -- closing ----------------------------------------------------------------------------
    async def close(self, timeout_s: float | None = None) -> int:
        """Flush for at most ``timeout_s`` (default: the delivery timeout), stop the poll thread.

        Returns how many records were left unflushed. Idempotent: a second call returns 0."""
        return await asyncio.to_thread(self.close_sync, timeout_s)

    def close_sync(self, timeout_s: float | None = None) -> int:
        """Blocking `close`."""
        with self._lock:
            if self.closed:
                return 0
            self.closed = True
        left = int(self._client.flush(self._wait_s(timeout_s)) or 0)
        self._stop.set()
        if self._poller is not None:
            self._poller.join()
        return left

    # -- internals --------------------------------------------------------------------------
    def _check_open(self, topic: str) -> None:
        if self.closed:  # no poll thread would ever resolve the ack
            raise PublishFailed(f"the producer for {topic} is closed", possibly_persisted=False, permanent=True)

    def _try_produce(self, topic: str, key: bytes | None, value: bytes, headers: Headers, on_delivery: Any) -> bool:
        """Hand one record to librdkafka; False when its local queue is full (the caller waits)."""
        try:
            if headers:
                self._client.produce(topic, key=key, value=value, headers=headers, on_delivery=on_delivery)
            else:  # no empty header list on the wire: the same record whichever path sent it
                self._client.produce(topic, key=key, value=value, on_delivery=on_delivery)
        except BufferError:
            return False
        except (confluent_kafka.KafkaException, ValueError, TypeError) as exc:
            raise PublishFailed(f"cannot produce to {topic}: {exc}", possibly_persisted=False,
                                permanent=True) from exc
        return True

    def _make_room(self) -> None:
        if self._poller is not None:
            time.sleep(0.005)  # the poll thread serves the callbacks that free the queue
        else:
            self._client.poll(0.1)

    def _wait_s(self, timeout_s: float | None) -> float:
        # A little past the delivery timeout: by then librdkafka has reported every record.
        return timeout_s if timeout_s is not None else self._timeout_s + 1.0

    def _start_poller(self) -> None:
        with self._lock:
            if self._poller is None:
                self._poller = threading.Thread(target=self._poll, name=self._name, daemon=True)
                self._poller.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self._client.poll(0.05)  # delivery callbacks of the async path run on this thread


def _position(msg: Any) -> tuple[int, int]:
    return (msg.partition(), msg.offset()) if msg is not None else (-1, -1)
