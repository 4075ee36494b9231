"""The reference policy's tokenizer: deterministic, built in code, no downloads.

Layout of ids (fixed, part of the contract):

* ``0 .. 15``    special tokens (``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``,
  ``<tool_call>``, ``</tool_call>``, ``<think>``, ``</think>``, then reserved ones);
* ``16 .. 271``  one token per byte value (byte fallback: any UTF-8 text encodes);
* ``272 ..``     multi-character pieces: words with and without a leading space, some
  capitalised words, digit pairs, punctuation/JSON pieces and whitespace runs.

Encoding: split on special tokens (always atomic), run a GPT-2-style pre-tokenizer over
each plain segment, map each pre-token to its piece id when the vocabulary has it whole,
else greedy longest match over pieces, else UTF-8 bytes.

Guarantees:

* ``decode(encode(t)) == t`` for every string ``t`` without lone surrogates (those still
  encode, as bytes, and decode as U+FFFD).
* Tokenization never crosses a special token: no special token string is a prefix of
  another, and each starts with ``<`` that occurs nowhere else in it, so a special-token
  match can never straddle the boundary of a special token. Hence
  ``encode(a + b) == encode(a) + encode(b)`` whenever ``a`` ends with a special token or
  ``b`` starts with one.
* Each piece string has exactly one id (single ASCII characters are their byte tokens),
  so a sequence of whole pre-token pieces is the canonical encoding of its text.
"""

from __future__ import annotations

import functools
import re

from compose.engines.policy import words as _words

SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
) + tuple(f"<|reserved_{i}|>" for i in range(9))

ENDOFTEXT, IM_START, IM_END, TOOL_CALL, TOOL_CALL_END, THINK, THINK_END = range(7)
N_SPECIAL = len(SPECIAL_TOKENS)
BYTE_OFFSET = N_SPECIAL
PIECE_OFFSET = BYTE_OFFSET + 256

# GPT-2's pattern rewritten for the stdlib `re` (no \p classes): letters are word
# characters minus digits and underscore; "other" is anything neither space nor word
# character, plus the underscore. Together with \s the classes cover every character.
_PRETOKENIZE = re.compile(
    r"""'(?:[sdmt]|ll|ve|re)| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+"""
)
_SPECIAL_SPLIT = re.compile(
    "(" + "|".join(re.escape(s) for s in sorted(SPECIAL_TOKENS, key=len, reverse=True)) + ")"
)
_MISS_CACHE_LIMIT = 65536


def _pieces(max_words: int | None) -> list[str]:
    words = _words.WORDS if max_words is None else _words.WORDS[:max_words]
    candidates: list[str] = []
    for w in words:
        candidates += (w, " " + w)
    for w in _words.CAPITALISED:
        candidates += (w, " " + w)
    digits = [f"{i:02d}" for i in range(100)]
    candidates += digits + [" " + str(i) for i in range(10)] + [" " + d for d in digits]
    candidates += _words.PUNCTUATION + _words.WHITESPACE
    specials = set(SPECIAL_TOKENS)
    # Single-byte strings are already byte tokens; keeping one id per string is what
    # makes "whole pieces" canonical.
    return [
        p
        for p in dict.fromkeys(candidates)
        if len(p.encode("utf-8")) > 1 and p not in specials
    ]


class Tokenizer:
    """Encode/decode text; see the module docstring for the id layout and guarantees."""

    def __init__(self, max_words: int | None = None) -> None:
        pieces = _pieces(max_words)
        self._bytes: list[bytes] = [s.encode("utf-8") for s in SPECIAL_TOKENS]
        self._bytes += [bytes([b]) for b in range(256)]
        self._bytes += [p.encode("utf-8") for p in pieces]
        self._str: list[str] = list(SPECIAL_TOKENS)
        self._str += [bytes([b]).decode("utf-8", errors="replace") for b in range(256)]
        self._str += pieces
        self._special_id = {s: i for i, s in enumerate(SPECIAL_TOKENS)}
        self._piece_id: dict[str, int] = {chr(b): BYTE_OFFSET + b for b in range(128)}
        self._piece_id.update({p: PIECE_OFFSET + i for i, p in enumerate(pieces)})
        self._max_piece_chars = max(len(p) for p in self._piece_id)
        self._miss_cache: dict[str, tuple[int, ...]] = {}
        self.vocab_size = len(self._bytes)

    # -- encoding -------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special token strings become their special ids."""
        out: list[int] = []
        for i, segment in enumerate(_SPECIAL_SPLIT.split(text)):
            if i % 2:
                out.append(self._special_id[segment])
            elif segment:
                self._encode_plain(segment, out)
        return out

    def encode_plain(self, text: str) -> list[int]:
        """Like ``encode`` but special token strings are encoded as ordinary text."""
        out: list[int] = []
        if text:
            self._encode_plain(text, out)
        return out

    def _encode_plain(self, segment: str, out: list[int]) -> None:
        get = self._piece_id.get
        pieces = _PRETOKENIZE.findall(segment)
        ids = [get(p, -1) for p in pieces]
        if -1 not in ids:  # fast path: every pre-token is a whole piece
            out.extend(ids)
            return
        for piece, tid in zip(pieces, ids):
            if tid >= 0:
                out.append(tid)
            else:
                out.extend(self._encode_piece(piece))

    def _encode_piece(self, piece: str) -> tuple[int, ...]:
        cached = self._miss_cache.get(piece)
        if cached is not None:
            return cached
        get = self._piece_id.get
        ids: list[int] = []
        i, n = 0, len(piece)
        while i < n:
            for length in range(min(self._max_piece_chars, n - i), 0, -1):
                tid = get(piece[i : i + length])
                if tid is not None:
                    ids.append(tid)
                    i += length
                    break
            else:  # no piece starts here: fall back to the character's UTF-8 bytes
                # (a lone surrogate from JSON input encodes too, and decodes as U+FFFD)
                ids.extend(BYTE_OFFSET + b for b in piece[i].encode("utf-8", "surrogatepass"))
                i += 1
        result = tuple(ids)
        if len(self._miss_cache) < _MISS_CACHE_LIMIT:
            self._miss_cache[piece] = result
        return result

    # -- decoding -------------------------------------------------------------------

    def decode(self, ids: list[int] | tuple[int, ...], skip_special_tokens: bool = False) -> str:
        """Text of ``ids``; invalid UTF-8 (a split multi-byte character) becomes U+FFFD."""
        table = self._bytes
        try:
            if skip_special_tokens:
                data = b"".join(table[i] for i in ids if i >= N_SPECIAL)
            else:
                data = b"".join(table[i] for i in ids)
        except (IndexError, TypeError):
            bad = next(i for i in ids if not self.is_valid(i))
            raise ValueError(f"token id {bad!r} is not in the vocabulary") from None
        return data.decode("utf-8", errors="replace")

    def is_valid(self, token_id: object) -> bool:
        return isinstance(token_id, int) and not isinstance(token_id, bool) and (
            0 <= token_id < self.vocab_size
        )

    def token_str(self, token_id: int) -> str:
        """The token's text as a logprob entry shows it (U+FFFD for partial bytes)."""
        return self._str[token_id]

    def token_bytes(self, token_id: int) -> bytes:
        return self._bytes[token_id]

    def is_special(self, token_id: int) -> bool:
        return 0 <= token_id < N_SPECIAL

    def piece_id(self, piece: str) -> int | None:
        """The id of a whole piece (or single ASCII character), if the vocabulary has it."""
        return self._piece_id.get(piece)

    # -- sets the sampler draws from ------------------------------------------------

    @functools.cached_property
    def spaced_word_ids(self) -> tuple[int, ...]:
        """Ids of `" word"` pieces: each is a whole pre-token after any word or `.`."""
        return tuple(self._piece_id[" " + w] for w in self._word_list() if " " + w in self._piece_id)

    @functools.cached_property
    def sentence_start_ids(self) -> tuple[int, ...]:
        """Ids of capitalised words without a leading space (a sentence's first token)."""
        return tuple(self._piece_id[w] for w in _words.CAPITALISED)

    def _word_list(self) -> tuple[str, ...]:
        return tuple(w for w in _words.WORDS if len(w) > 1)


@functools.lru_cache(maxsize=8)
def get_tokenizer(max_words: int | None = None) -> Tokenizer:
    """A shared tokenizer; building one costs a few milliseconds."""
    return Tokenizer(max_words)
