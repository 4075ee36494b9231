"""A local, fsynced, append-only spool of events that Kafka could not take yet.

When the broker is unavailable, the interceptor writes the event here and
fsyncs before answering the harness, so an acknowledged call is never lost;
the drainer publishes spooled events to Kafka later, in the order they were
spooled. The spool survives a restart of the interceptor: opening it finds
the records not yet drained.

Layout: one directory per interceptor process (held with an exclusive flock):
``spool.log`` holds records ``[u32 length][u32 crc32][payload]``, where the
payload is ``[u16 topic][topic][u32 key][key][u8 flags][value]``;
``cursor`` holds the byte offset up to which records were drained (written
atomically). A torn last record (a crash mid-append) was never acknowledged
to anyone and is cut off. When everything is drained the log is truncated.

Memory: the spool holds only the positions of the pending records (a few tens
of bytes each); a record's bytes are read back from the log when it reaches the
head, so a long outage costs disk, not the interceptor's memory
(``tokentrail bench memory``, mode ``spool``).
"""

from __future__ import annotations

import fcntl
import os
import struct
import zlib
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from schemas.errors import DurabilityError

UNCERTAIN = 0x01  # Kafka may already hold this record (its ack was lost): check before republishing
_HEADER = struct.Struct(">II")


@dataclass(frozen=True, slots=True)
class SpooledRecord:
    offset: int  # byte offset of the record in spool.log
    end: int  # byte offset just past it
    topic: str
    key: bytes
    value: bytes
    flags: int

    @property
    def uncertain(self) -> bool:
        return bool(self.flags & UNCERTAIN)


class Spool:
    """The spool of one interceptor process; not thread-safe (one event loop owns it)."""

    def __init__(self, directory: Path | str) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = open(self.dir / "lock", "a+")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise DurabilityError(
                f"spool directory {self.dir} is in use by another interceptor process; give each process its own"
            ) from exc
        self._log_path = self.dir / "spool.log"
        self._cursor_path = self.dir / "cursor"
        self._fd = os.open(self._log_path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        self._cursor = self._read_cursor()
        self._pending: deque[tuple[int, int]] = self._scan()  # (offset, end) of each record not drained
        self._head: SpooledRecord | None = None  # the first pending record, read back once

    # -- writing ------------------------------------------------------------------
    def append(self, topic: str, key: bytes, value: bytes, *, flags: int = 0) -> None:
        """Append and fsync one record; returns only when it is on disk."""
        t = topic.encode()
        payload = struct.pack(">H", len(t)) + t + struct.pack(">I", len(key)) + key + bytes([flags]) + value
        record = _HEADER.pack(len(payload), zlib.crc32(payload)) + payload
        try:
            start = os.lseek(self._fd, 0, os.SEEK_END)
            os.write(self._fd, record)
            os.fsync(self._fd)
        except OSError as exc:
            raise DurabilityError(f"cannot write the spool at {self._log_path}: {exc}") from exc
        self._pending.append((start, start + len(record)))

    # -- draining -----------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._pending)

    def head(self) -> SpooledRecord | None:
        """The oldest record not drained yet (read back from the log once), or None."""
        if not self._pending:
            return None
        if self._head is None:
            start, end = self._pending[0]
            data = os.pread(self._fd, end - start, start)
            self._head = _parse(start, end, data[_HEADER.size :])
        return self._head

    def pop(self, record: SpooledRecord) -> None:
        """Mark the head record drained (persisted before returning)."""
        assert self._head is record and self._pending[0] == (record.offset, record.end), "records are drained in order"
        self._pending.popleft()
        self._head = None
        if not self._pending:
            # Fully drained: start over with an empty log (cursor first, so a crash
            # between the two leaves a cursor past the end, read as "all drained").
            self._write_cursor(0)
            os.ftruncate(self._fd, 0)
            os.fsync(self._fd)
        else:
            self._write_cursor(record.end)

    def close(self) -> None:
        os.close(self._fd)
        fcntl.flock(self._lock, fcntl.LOCK_UN)
        self._lock.close()

    # -- internals ----------------------------------------------------------------
    def _read_cursor(self) -> int:
        try:
            return int(self._cursor_path.read_text() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def _write_cursor(self, offset: int) -> None:
        tmp = self._cursor_path.with_suffix(".tmp")
        with open(tmp, "w") as fh:
            fh.write(str(offset))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self._cursor_path)
        self._cursor = offset

    def _scan(self) -> deque[tuple[int, int]]:
        data = self._log_path.read_bytes()
        if self._cursor > len(data):
            self._cursor = len(data)
        records: deque[tuple[int, int]] = deque()
        pos = self._cursor
        while pos + _HEADER.size <= len(data):
            length, crc = _HEADER.unpack_from(data, pos)
            payload = data[pos + _HEADER.size : pos + _HEADER.size + length]
            if len(payload) < length or zlib.crc32(payload) != crc:
                break
            records.append((pos, pos + _HEADER.size + length))
            pos += _HEADER.size + length
        if pos < len(data):
            os.ftruncate(self._fd, pos)  # a torn tail was never acknowledged to anyone
            os.fsync(self._fd)
        return records


def _parse(offset: int, end: int, payload: bytes) -> SpooledRecord:
    (tlen,) = struct.unpack_from(">H", payload, 0)
    topic = payload[2 : 2 + tlen].decode()
    (klen,) = struct.unpack_from(">I", payload, 2 + tlen)
    kstart = 6 + tlen
    key = payload[kstart : kstart + klen]
    flags = payload[kstart + klen]
    return SpooledRecord(offset, end, topic, key, payload[kstart + klen + 1 :], flags)
