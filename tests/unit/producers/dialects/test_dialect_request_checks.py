"""The translators refuse what the Anthropic / Responses APIs refuse, naming the field (pure, no interceptor)."""

from __future__ import annotations

import pytest

from producers.dialects import anthropic, responses
from producers.dialects.common import DialectError

HI = [{"role": "user", "content": "hi"}]


def test_anthropic_stop_sequences_is_a_list_of_strings_never_split_into_characters():
    assert anthropic.to_chat_request({"messages": HI, "stop_sequences": ["END", "STOP"]})["stop"] == ["END", "STOP"]
    with pytest.raises(DialectError, match="'stop_sequences' must be an array.*got string 'END'"):
        anthropic.to_chat_request({"messages": HI, "stop_sequences": "END"})
    with pytest.raises(DialectError, match=r"'stop_sequences\[1\]' must be a string"):
        anthropic.to_chat_request({"messages": HI, "stop_sequences": ["END", 3]})


def test_anthropic_messages_must_hold_one_message():
    with pytest.raises(DialectError, match="'messages' is empty: at least one message is required"):
        anthropic.check_request({"messages": []})
    anthropic.check_request({"messages": HI})


def test_anthropic_image_source_must_be_an_object():
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "see"},
                                                      {"type": "image", "source": "https://x/y.png"}]}]}
    with pytest.raises(DialectError, match=r"'messages\[0\]\.content\[1\]\.source'.*must be an object"):
        anthropic.to_chat_request(body)
    # after leading tool results the index is still the block's index in the message
    body["messages"][0]["content"].insert(0, {"type": "tool_result", "tool_use_id": "t", "content": "ok"})
    with pytest.raises(DialectError, match=r"'messages\[0\]\.content\[2\]\.source'"):
        anthropic.to_chat_request(body)


@pytest.mark.parametrize("tools", ["Bash", {"name": "Bash"}, 3])
def test_tools_must_be_a_list_in_both_dialects(tools):
    with pytest.raises(DialectError, match="'tools' must be an array"):
        anthropic.to_chat_request({"messages": HI, "tools": tools})
    with pytest.raises(DialectError, match="'tools' must be an array"):
        responses.to_chat_request({"input": "hi", "tools": tools})


def chunk(**delta):
    return {"choices": [{"index": 0, "delta": delta}]}


def test_the_responses_error_event_continues_the_sequence_of_what_was_sent():
    t = responses.StreamTranslator("resp_tt" + "0" * 32, "m", {"input": "hi"})
    sent = t.feed(chunk(role="assistant", content="He")) + t.feed(chunk(content="llo"))
    assert [d["sequence_number"] for _, d in sent] == list(range(len(sent)))
    name, data = t.error_event("502", "the model stream failed")
    assert name == "error" and data["type"] == "error" and data["sequence_number"] == len(sent)
    assert data["code"] == "502" and data["param"] is None


def test_events_of_a_finish_that_was_never_sent_are_not_counted():
    t = responses.StreamTranslator("resp_tt" + "0" * 32, "m", {"input": "hi"})
    sent = t.feed(chunk(role="assistant", content="Hi"))
    t.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    sent_total = t.sequence
    rest, terminal = t.finish()  # built, then the capture was not durable: never sent
    assert terminal[1]["sequence_number"] > sent_total
    assert t.error_event("503", "not durable")[1]["sequence_number"] == sent_total
    assert len(sent) <= sent_total
