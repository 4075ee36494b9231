"""The reference policy tokenizer: layout, round trips, and the special-token split rule."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compose.engines.policy import tokenizer as tk
from compose.engines.policy.tokenizer import SPECIAL_TOKENS, Tokenizer, get_tokenizer
from compose.engines.policy.words import CAPITALISED, WORDS

TOK = get_tokenizer()

specials = st.sampled_from(SPECIAL_TOKENS)
# text that likes the characters special tokens are made of, so near-misses get tried
texts = st.text(
    alphabet=st.one_of(st.characters(exclude_categories=["Cs"]), st.sampled_from(list("<>|_/ \n{}\":,.thinkool'"))),
    max_size=60,
)


def test_id_layout_is_fixed():
    assert [TOK.encode(s) for s in SPECIAL_TOKENS] == [[i] for i in range(len(SPECIAL_TOKENS))]
    assert (tk.ENDOFTEXT, tk.IM_START, tk.IM_END) == (0, 1, 2)
    assert (tk.TOOL_CALL, tk.TOOL_CALL_END, tk.THINK, tk.THINK_END) == (3, 4, 5, 6)
    assert tk.BYTE_OFFSET == len(SPECIAL_TOKENS) and tk.PIECE_OFFSET == tk.BYTE_OFFSET + 256
    for b in range(256):
        assert TOK.token_bytes(tk.BYTE_OFFSET + b) == bytes([b])
    assert 3000 <= TOK.vocab_size <= 8000


def test_every_token_string_has_one_id():
    strings = [TOK.token_bytes(i) for i in range(TOK.vocab_size)]
    assert len(set(strings)) == len(strings)


def test_word_list_is_lowercase_ascii_words():
    assert all(w.isascii() and w.isalpha() and w.islower() for w in WORDS)
    assert len(WORDS) == len(set(WORDS)) >= 1000
    assert all(w[0].isupper() for w in CAPITALISED)


def test_two_builds_are_identical():
    other = Tokenizer()
    assert [other.token_bytes(i) for i in range(other.vocab_size)] == [
        TOK.token_bytes(i) for i in range(TOK.vocab_size)
    ]


def test_json_tool_call_body_maps_onto_whole_pieces():
    body = '{"name": "Bash", "arguments": {"command": "echo tokentrail-1"}}'
    pieces = [TOK.token_str(i) for i in TOK.encode(body)]
    assert pieces == ['{"', "name", '":', ' "', "Bash", '",', ' "', "arguments", '":', ' {"',
                      "command", '":', ' "', "echo", " tokentrail", "-", "1", '"}}']


def test_words_with_and_without_space_are_single_tokens():
    for word in ("the", "answer", "tokentrail", "command"):
        assert len(TOK.encode(word)) == 1
        assert len(TOK.encode(" " + word)) == 1


def test_non_ascii_falls_back_to_bytes():
    ids = TOK.encode("héllo 😀")
    assert TOK.decode(ids) == "héllo 😀"
    assert any(tk.BYTE_OFFSET + 0x80 <= i < tk.PIECE_OFFSET for i in ids)
    # a lone continuation byte shows as U+FFFD, like a partial token in vLLM's logprobs
    assert TOK.token_str(tk.BYTE_OFFSET + 0xA9) == "\ufffd"


def test_decode_rejects_unknown_ids():
    with pytest.raises(ValueError, match="not in the vocabulary"):
        TOK.decode([1, TOK.vocab_size])
    with pytest.raises(ValueError):
        TOK.decode([-1 - 2**40])


def test_lone_surrogates_encode_without_error():
    assert TOK.decode(TOK.encode("a\ud800b")) == "a\ufffd\ufffd\ufffdb"


def test_skip_special_tokens():
    ids = TOK.encode("<|im_start|>user\nhi<|im_end|>")
    assert TOK.decode(ids, skip_special_tokens=True) == "user\nhi"


def test_encode_plain_treats_special_strings_as_text():
    ids = TOK.encode_plain("<think>")
    assert all(not TOK.is_special(i) for i in ids) and TOK.decode(ids) == "<think>"


@settings(max_examples=300)
@given(texts)
def test_round_trip(text):
    assert TOK.decode(TOK.encode(text)) == text


@settings(max_examples=300)
@given(texts, specials, texts)
def test_split_after_a_special_token(a, special, b):
    left = a + special
    assert TOK.encode(left + b) == TOK.encode(left) + TOK.encode(b)


@settings(max_examples=300)
@given(texts, specials, texts)
def test_split_before_a_special_token(a, special, b):
    right = special + b
    assert TOK.encode(a + right) == TOK.encode(a) + TOK.encode(right)


@settings(max_examples=200)
@given(st.lists(st.one_of(texts, specials), max_size=8))
def test_specials_are_atomic_in_any_mix(parts):
    # the text between two special tokens is encoded on its own, whatever surrounds it
    expected: list[int] = []
    run = ""
    for part in parts:
        if part in SPECIAL_TOKENS:
            expected += TOK.encode(run) + TOK.encode(part)
            run = ""
        else:
            run += part
    expected += TOK.encode(run)
    assert TOK.encode("".join(parts)) == expected
