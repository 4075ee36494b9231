"""The one exception hierarchy of tokentrail.

Every error a user can see derives from ``TokentrailError`` and says what was
wrong (the field and the value) and what to do about it. Third-party errors
(fastavro, confluent_kafka, httpx, faust) are wrapped at the boundary with
``raise XError(...) from exc``, so callers catch one family.
"""

from __future__ import annotations


class TokentrailError(Exception):
    """Root of every tokentrail error."""


class ContractError(TokentrailError):
    """A value violates the wire contract (a field, an id, a record invariant)."""


class CodecError(ContractError):
    """Bytes could not be decoded into, or a record encoded as, a contract record."""


class SchemaVersionError(CodecError):
    """A record was written by a newer schema than this reader supports."""


class ConfigError(TokentrailError):
    """Settings or a plugin are invalid; raised at startup before any I/O."""


class TransportError(TokentrailError):
    """Kafka or HTTP I/O failed (wraps the client library's error)."""


class DurabilityError(TransportError):
    """Evidence of a model call could not be made durable (Kafka and spool both failed)."""
