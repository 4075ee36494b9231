"""Golden vectors: the four hashes are byte-compatible with NeMo Gym's (never regenerate silently)."""

from __future__ import annotations

import pytest

from schemas.hashing import (
    FingerprintHasher,
    assistant_fingerprint,
    canonicalize_tool_arguments,
    compute_digest,
    conversation_digest,
    conversation_prefix_digests,
    text_digest,
)

TOOL_FP = "82955bc805cccaf9d2faa840479ff6c30420d20e42bf2bc1ebef14d679ec3768"


@pytest.mark.parametrize(
    ("ids", "expected"),
    [
        ([], "2e222d36d0c6ae1db1ec18b3f96d9a46df5db61b40137bbfbac4cdf0acde9763"),
        ([0], "0596efeb21b51ec6eb122c9e470703df19a095a7c5ccb96bf87df0ba2447ba59"),
        ([1, 2, 3], "bf99633051449f0f3248b4995a7c8468b9561d7732447341916085f12ff9ff54"),
        (list(range(1000)), "9b33490a72c5e86cc27fcc0916a08dbb8f1edeb5f108d010dad1b616bd7f0a2b"),
    ],
    ids=["empty", "zero", "small", "range1000"],
)
def test_compute_digest_golden(ids, expected):
    assert compute_digest(ids) == expected


def test_compute_digest_rejects_negative_ids_naming_the_value():
    with pytest.raises(ValueError, match="-1"):
        compute_digest([1, -1])


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        (
            [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi there"}],
            "5b20b01e7ca4ec80db6e221c277c02a796f6a2b90e81c7adaf7f1b8fc2c6846e",
        ),
        (
            [
                {"role": "user", "content": "find x"},
                {
                    "role": "assistant",
                    "content": "calling",
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"q": "x", "k": 3}'}}
                    ],
                },
            ],
            TOOL_FP,
        ),
        (
            [
                {"role": "user", "content": "find x"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "calling"},
                        {"type": "tool_use", "id": "c1", "name": "search", "input": {"k": 3, "q": "x"}},
                    ],
                },
            ],
            TOOL_FP,
        ),
        (
            [
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "calling"}]},
                {"type": "function_call", "call_id": "c1", "name": "search", "arguments": '{"k":3,"q":"x"}'},
            ],
            TOOL_FP,
        ),
        ([], ""),
    ],
    ids=["plain", "chat_tool", "anthropic_tool", "responses_tool", "empty"],
)
def test_assistant_fingerprint_golden(items, expected):
    assert assistant_fingerprint(items) == expected


@pytest.mark.parametrize("cut", [0, 1, 2])
def test_an_extended_fingerprint_is_the_fingerprint_of_the_joined_items(cut):
    """A capture's continuation fingerprint hashes only the answer (FingerprintHasher.extended): the same bytes."""
    conversation = [
        {"role": "user", "content": "find x"},
        {"role": "assistant", "content": "calling", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"q": "x"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "x is 3"},
    ]
    answer = [{"role": "assistant", "content": "x is 3"}]
    request = conversation[:cut]
    hasher = FingerprintHasher(request)
    assert hasher.hexdigest() == assistant_fingerprint(request)
    assert hasher.extended(answer) == assistant_fingerprint(request + answer)
    assert hasher.extended(conversation[cut:]) == assistant_fingerprint(conversation)
    assert hasher.extended([]) == assistant_fingerprint(request)  # extending twice: the state is left as it was
    assert FingerprintHasher([]).extended([{"role": "user", "content": "hi"}]) == ""  # still a root


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        (
            [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi there"}],
            "db10e497fe3d0ee04e81f35f2e3b7857e4c066f5ccaec3c5fcd279f2793ca81b",
        ),
        (
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "look"},
                        {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
                    ],
                },
                {"role": "assistant", "content": "seen"},
            ],
            "18d4045a0813dfbe915b43efde91849b483eaf207ba7d130f00473966dc28591",
        ),
        (
            [{"role": "tool", "tool_call_id": "c1", "content": "42"}, {"role": "assistant", "content": "done"}],
            "497f57bc226bd826c8d8cb340f7ab535585c0c86123085c958f880c39e83ec3e",
        ),
        ([], "edd3713968ca572ae44468ff61fabbec572e8de247023892e8bdf0f55aa8cb9f"),
    ],
    ids=["plain", "multimodal", "tool_result", "empty"],
)
def test_conversation_digest_golden(items, expected):
    assert conversation_digest(items) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ('{"k": 3, "q": "x"}', '{"k":3,"q":"x"}'),
        ('{"s": "café \\"quoted\\"", "n": 1.5}', '{"n":1.5,"s":"café \\"quoted\\""}'),
        (None, ""),
    ],
    ids=["reordered", "unicode", "none"],
)
def test_canonicalize_tool_arguments_golden(value, expected):
    assert canonicalize_tool_arguments(value) == expected


def test_fingerprint_ignores_user_and_tool_turns_but_digest_does_not():
    base = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    changed = [{"role": "user", "content": "A"}, {"role": "assistant", "content": "b"}]
    assert assistant_fingerprint(base) == assistant_fingerprint(changed)
    assert conversation_digest(base) != conversation_digest(changed)


def test_tool_argument_reserialisation_keeps_the_fingerprint_but_ids_change_it():
    def conv(args, call_id="c1"):
        return [
            {"role": "assistant", "tool_calls": [{"id": call_id, "function": {"name": "f", "arguments": args}}]}
        ]

    assert assistant_fingerprint(conv('{"a": 1, "b": 2}')) == assistant_fingerprint(conv('{"b":2,"a":1}'))
    assert assistant_fingerprint(conv('{"a": 1}')) != assistant_fingerprint(conv('{"a": 1}', call_id="c2"))


def test_prefix_digests_equal_digests_of_prefixes():
    items = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "a", "tool_calls": [{"id": "t", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "t", "content": "r"},
    ]
    assert conversation_prefix_digests(items) == [conversation_digest(items[:k]) for k in range(len(items) + 1)]


def test_non_object_items_fail_closed():
    with pytest.raises(ValueError, match="JSON object"):
        conversation_digest(["not a message"])
    with pytest.raises(ValueError, match="JSON object"):
        assistant_fingerprint([42])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # hashlib.sha256(b"tokentrail-opening-text\x00Explore the repo"): the layout, computed independently.
        ("Explore the repo", "e0a0c0a987d885ba27cfa57bf2e274f3a07683d68673e37250e01ad4d4fddf54"),
        ("  Explore\n the\t  repo ", "e0a0c0a987d885ba27cfa57bf2e274f3a07683d68673e37250e01ad4d4fddf54"),
        ("", "0bfbd8fc2de8b205e1b0eb190787ea08ea958d00ef6ecd0d23efe41b1bc6c5a1"),
    ],
)
def test_text_digest_golden(text, expected):
    # Capture hashes a sub-agent's opening message, rebuild the Agent/Task call's prompt argument.
    assert text_digest(text) == expected
