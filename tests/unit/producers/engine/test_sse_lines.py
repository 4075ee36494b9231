"""``sse_lines``: an SSE body's lines as the spec splits them (CRLF, LF, CR), whatever its chunking."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from producers.engine.sse_lines import sse_lines


def _spec_lines(body: bytes) -> list[bytes]:
    """The reference: the spec's rule, byte by byte (a CR then an LF is one line end)."""
    lines, line, i = [], bytearray(), 0
    while i < len(body):
        byte = body[i:i + 1]
        if byte in (b"\r", b"\n"):
            lines.append(bytes(line))
            line = bytearray()
            if byte == b"\r" and body[i + 1:i + 2] == b"\n":
                i += 1
        else:
            line += byte
        i += 1
    if line:
        lines.append(bytes(line))
    return lines


async def _lines(chunks: list[bytes]) -> list[bytes]:
    async def source():
        for chunk in chunks:
            yield chunk

    return [line async for line in sse_lines(source())]


def _cut(body: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(body)) for c in cuts})
    return [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]


_text = st.sampled_from([b"data: {\"a\":1}", b"", b"x", "\u2028".encode(), "\u2029\u0085 \x0b\x0c\x1c".encode(),
                         "d\u00e9j\u00e0 \U0001f642".encode(), b"data: [DONE]", b":comment"])


@settings(max_examples=400, deadline=None)
@given(parts=st.lists(st.tuples(_text, st.sampled_from([b"\n", b"\r\n", b"\r", b"\n\n"])), max_size=12),
       tail=_text, cuts=st.lists(st.integers(0, 400), max_size=10))
async def test_lines_are_the_specs_whatever_the_chunking(parts, tail, cuts):
    body = b"".join(text + end for text, end in parts) + tail
    assert await _lines(_cut(body, cuts)) == _spec_lines(body)


async def test_a_token_holding_a_line_separator_stays_in_its_chunk():
    # httpx's aiter_lines (str.splitlines) cut this chunk in two at U+2028.
    chunk = 'data: {"choices":[{"delta":{"content":"a\u2028b\u0085c"}}]}\n\n'.encode()
    assert await _lines([chunk, b"data: [DONE]\n\n"]) == [chunk[:-2], b"", b"data: [DONE]", b""]


async def test_a_crlf_split_across_chunks_is_one_line_end_and_a_last_cr_ends_the_stream():
    assert await _lines([b"data: 1\r", b"\ndata: 2\r"]) == [b"data: 1", b"data: 2"]
    assert await _lines([b"a\r", b"", b"b"]) == [b"a", b"b"]


async def test_a_line_over_many_chunks_comes_out_whole():
    # A 128k-token prompt's ids arrive as one ~800 KB line over many network reads.
    line = b"data: {\"prompt_token_ids\":[" + b",".join(b"%d" % i for i in range(20000)) + b"]}"
    chunks = [line[i:i + 997] for i in range(0, len(line), 997)] + [b"\n\ndata: [DONE]\n\n"]
    assert await _lines(chunks) == [line, b"", b"data: [DONE]", b""]
