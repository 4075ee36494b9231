"""The chat template: exact rendering, and prompts that extend the previous call's ids."""

from __future__ import annotations

import json

import pytest

from compose.engines.policy import template
from compose.engines.policy.testkit import BASH, TOOLS, chat, echo, tool_results, user_turn
from compose.engines.policy.tokenizer import TOOL_CALL, get_tokenizer

TOK = get_tokenizer()


def test_messages_render_chatml_joined_by_newlines():
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert template.render_prompt(messages) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    )
    assert template.render_prompt(messages, add_generation_prompt=False).endswith("U<|im_end|>")


def test_tools_render_into_the_system_message():
    with_system = template.render_messages(user_turn("hi"), [BASH])
    listing = json.dumps(BASH["function"], sort_keys=True, ensure_ascii=False)
    assert with_system.startswith("<|im_start|>system\nYou are a careful agent.\n\n# Tools\n")
    assert listing in with_system and with_system.count("<|im_start|>system") == 1
    created = template.render_messages([{"role": "user", "content": "hi"}], [BASH])
    assert created.startswith("<|im_start|>system\n# Tools\n") and listing in created
    # deterministic: key order of the request does not matter
    shuffled = {"type": "function", "function": dict(reversed(list(BASH["function"].items())))}
    assert template.render_messages(user_turn("hi"), [shuffled]) == with_system


def test_tool_calls_render_arguments_verbatim():
    odd = '{"command":  "ls -la",\n "x": 1}'  # not what json.dumps would write
    message = {"role": "assistant", "content": "Let me look.", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "Bash", "arguments": odd}},
        {"id": "c2", "type": "function", "function": {"name": "Read", "arguments": "{}"}},
    ]}
    assert template.render_message(message) == (
        '<|im_start|>assistant\nLet me look.<tool_call>{"name": "Bash", "arguments": '
        + odd + '}</tool_call><tool_call>{"name": "Read", "arguments": {}}</tool_call><|im_end|>'
    )


def test_tool_results_and_reasoning():
    assert template.render_message({"role": "tool", "tool_call_id": "c", "content": "out"}) == (
        "<|im_start|>tool\nout<|im_end|>"
    )
    message = {"role": "assistant", "content": "A", "reasoning": " think hard"}
    assert template.render_message(message) == "<|im_start|>assistant\n<think> think hard</think>A<|im_end|>"
    legacy = {"role": "assistant", "content": "A", "reasoning_content": "r"}
    assert template.render_message(legacy) == "<|im_start|>assistant\n<think>r</think>A<|im_end|>"
    assert template.render_message(message, drop_reasoning=True) == "<|im_start|>assistant\nA<|im_end|>"


def test_content_parts():
    message = {"role": "user", "content": [
        {"type": "text", "text": "look at "},
        {"type": "image_url", "image_url": {"url": "data:..."}},
        {"type": "text", "text": " please"},
    ]}
    assert template.render_message(message) == "<|im_start|>user\nlook at [image] please<|im_end|>"


@pytest.mark.parametrize("bad", [
    [{"content": "no role"}], ["not an object"], [{"role": "user", "content": 3}],
    [{"role": "assistant", "tool_calls": [{"function": {}}]}],
])
def test_unrenderable_messages_raise(bad):
    with pytest.raises(template.TemplateError):
        template.render_messages(bad)


def test_continuation_is_the_tail_of_the_full_prompt():
    messages = user_turn() + [{"role": "assistant", "content": "Done."}, {"role": "user", "content": "More"}]
    full = template.render_prompt(messages)
    tail = template.render_continuation(messages[3:])
    assert full.endswith(tail) and tail.startswith("\n<|im_start|>user\nMore<|im_end|>")


# -- prefix extendability, through the server ------------------------------------

async def rollout(client, turns: int, tools=None, **body) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, generated ids) of each call of a faithful harness loop."""
    messages = user_turn()
    calls = []
    for turn in range(turns):
        data = await chat(client, messages=messages, tools=tools, return_token_ids=True, seed=turn, **body)
        calls.append((data["prompt_token_ids"], data["choices"][0]["token_ids"]))
        message = data["choices"][0]["message"]
        messages = messages + [echo(message)] + tool_results(message)
        if not message.get("tool_calls"):
            messages.append({"role": "user", "content": f"Thanks. Next question {turn}?"})
    return calls


def assert_each_prompt_extends_the_last(calls):
    for (prompt, generated), (next_prompt, _) in zip(calls, calls[1:]):
        assert next_prompt[: len(prompt) + len(generated)] == prompt + generated


@pytest.mark.parametrize("tools", [None, TOOLS], ids=["plain-chat", "tool-calls"])
@pytest.mark.parametrize("reasoning", [False, True], ids=["no-reasoning", "reasoning"])
async def test_prompt_n_plus_1_extends_prompt_n_plus_generation(make_client, tools, reasoning):
    client = make_client(reasoning=reasoning)
    calls = await rollout(client, 4, tools=tools)
    assert_each_prompt_extends_the_last(calls)
    if tools:  # two tool calls, then the answer, then (new user turn) a tool call again
        assert [TOOL_CALL in g for _, g in calls] == [True, True, False, True]


async def test_dropped_reasoning_breaks_the_extension(make_client):
    client = make_client(reasoning=True, drop_reasoning_in_history=True)
    calls = await rollout(client, 2, tools=TOOLS)
    prompt, generated = calls[0]
    assert calls[1][0][: len(prompt) + len(generated)] != prompt + generated
    assert calls[1][0][: len(prompt)] == prompt  # only the echoed turn is re-rendered


async def test_unfaithful_echo_breaks_the_extension(client):
    data = await chat(client, messages=user_turn(), tools=[BASH], return_token_ids=True)
    message = data["choices"][0]["message"]
    call = dict(message["tool_calls"][0])
    args = json.loads(call["function"]["arguments"])
    call["function"] = {"name": "Bash", "arguments": json.dumps(args, separators=(",", ":"))}
    messages = user_turn() + [{"role": "assistant", "content": None, "tool_calls": [call]}]
    messages += tool_results({"tool_calls": [call]})
    nxt = await chat(client, messages=messages, tools=[BASH], return_token_ids=True)
    prompt, generated = data["prompt_token_ids"], data["choices"][0]["token_ids"]
    assert nxt["prompt_token_ids"][: len(prompt) + len(generated)] != prompt + generated
