"""The lines of an engine's server-sent-event stream, split as the SSE spec splits them (pure).

An SSE line ends at CRLF, LF or CR, and nowhere else (WHATWG HTML, "Parsing an event stream"). httpx's
``aiter_lines`` splits like ``str.splitlines``, which also ends a line at U+2028, U+2029, U+0085 and a few
control characters. vLLM writes its chunks with pydantic, which leaves those characters raw inside JSON
strings, so a generated token holding one cut its chunk in two: two halves that are not JSON, and a call
recorded as ``stream_interrupted`` for a generation the engine completed.

Guarantees:

* ``sse_lines`` yields exactly the lines the spec's rule gives for the concatenated bytes, whatever the
  chunking: a CRLF split across two chunks is one line end, a CR at the very end of the stream ends its
  last line. Line ends are not included; a trailing partial line is yielded at the end.
* It works on bytes (orjson reads them as they are), with no text decoding: a stream that is not UTF-8 is
  refused where its JSON is read, as before.
* Per chunk, one C-level split (``bytes.split`` on LF, or ``bytes.splitlines`` when the chunk holds a CR);
  no Python work per byte, and a line that spans many chunks is joined once (linear in its length).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator

__all__ = ["sse_lines"]


async def sse_lines(chunks: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    """The SSE lines of the body that ``chunks`` delivers, line ends stripped (the module's guarantees)."""
    pending: list[bytes] = []  # a line's start, over as many chunks as it spans (joined once: linear)
    async for chunk in chunks:
        if not chunk:
            continue
        if b"\n" not in chunk and b"\r" not in chunk:  # the middle of a long line (a 128k prompt's ids)
            pending.append(chunk)
            continue
        data = b"".join((*pending, chunk)) if pending else chunk
        # A CR last may be the first half of a CRLF: it is decided with the next chunk.
        held = data.endswith(b"\r")
        lines = _split(data[:-1] if held else data)
        rest = lines.pop() + (b"\r" if held else b"")
        pending = [rest] if rest else []
        for line in lines:
            yield line
    if pending:
        lines = _split(b"".join(pending))
        if not lines[-1]:  # the stream ended on a line end (a held CR)
            lines.pop()
        for line in lines:
            yield line


def _split(data: bytes) -> list[bytes]:
    """``data``'s lines, the last one the text after the last line end (empty when it ends on one)."""
    if b"\r" not in data:  # vLLM's streams: LF only, one C split
        return data.split(b"\n")
    # bytes.splitlines ends lines at LF, CRLF and CR only (str.splitlines would also split at U+2028 & co)
    lines = data.splitlines()
    if not lines or data.endswith((b"\n", b"\r")):
        lines.append(b"")
    return lines
