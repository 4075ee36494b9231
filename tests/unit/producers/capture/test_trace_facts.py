"""Identity signals recorded as call facts at capture time (issue 12 point 2): the declared trace
(``x-tokentrail-trace``), the agent a harness names in its headers, the opening message's text digests.
Driven through the real Interceptor against a FakeVLLM, in all three dialects."""

from __future__ import annotations

import json

import pytest
from starlette.datastructures import Headers

from producers.capture.trace_facts import (
    AGENT_HEADERS,
    MAX_OPENING_DIGESTS,
    TRACE_HEADER,
    agent_name,
    opening_text_digests,
    trace_problem,
)
from producers.http.replies import upstream_headers
from schemas.hashing import text_digest
from schemas.records import CallCaptured
from tests.unit.producers.fake_vllm import FakeVLLM

BASE = "/ng-rollout/{rid}/training-token-capture/v1"
PROMPT = "Find   the bug in parse()\nand fix it."  # whitespace differs per dialect below: same digest
REMINDER = "<system-reminder>\nAs you answer, use the project's CLAUDE.md.\n</system-reminder>"


def chat(text: str = PROMPT) -> tuple[str, dict]:
    return "/chat/completions", {"model": "x", "messages": [{"role": "system", "content": "be brief"},
                                                             {"role": "user", "content": text}]}


def anthropic(text: str = PROMPT) -> tuple[str, dict]:
    blocks = [{"type": "text", "text": REMINDER},
              {"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}]
    return "/messages", {"model": "claude-x", "max_tokens": 64, "system": "be brief",
                         "messages": [{"role": "user", "content": blocks}]}


def responses(text: str = PROMPT) -> tuple[str, dict]:
    return "/responses", {"model": "gpt-x", "instructions": "be brief", "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "sandbox: none"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": " ".join(text.split())}]}]}


DIALECTS = {"chat": chat, "anthropic": anthropic, "responses": responses}


def captured(publisher) -> list[CallCaptured]:
    return [e.body for e in publisher.events if isinstance(e.body, CallCaptured)]


async def call(over_engine, dialect: str, headers: dict | None = None, rid: str = "t-1", stream: bool = False):
    engine = FakeVLLM()
    http, _ = await over_engine(engine)
    route, body = DIALECTS[dialect]()
    r = await http.post(BASE.format(rid=rid) + route, json={**body, "stream": stream}, headers=headers or {})
    return r, engine


def error_message(dialect: str, r) -> str:
    body = r.json()
    if dialect == "anthropic":
        assert body["type"] == "error"
    return body["error"]["message"]


# -- x-tokentrail-trace: grammar ------------------------------------------------------------------

VALID = ["main", "compaction", "subagent", "side", "other", "subagent:code-reviewer", "side:title",
         "other:a:b", "subagent:general purpose/v2@team_1.x", "subagent:" + "a" * 200]
INVALID = ["", "Main", "MAIN", "main:x", "compaction:1", "subagent:", "side:", "sub", "subagents",
           "subagent:tab\there", "subagent:a,b", "subagent:café", "subagent:" + "a" * 201, " main", "main ",
           "subagent:x\n"]


@pytest.mark.parametrize("value", VALID)
def test_the_grammar_admits_each_kind_and_its_labels(value):
    assert trace_problem(value) is None


@pytest.mark.parametrize("value", INVALID)
def test_the_grammar_refuses_anything_else_naming_header_value_and_grammar(value):
    message = trace_problem(value)
    assert message is not None
    assert TRACE_HEADER in message and repr(value[:80])[:40] in message
    assert "subagent[:LABEL]" in message and "[A-Za-z0-9_.:/@ -]" in message


def test_a_long_refused_value_is_quoted_truncated():
    message = trace_problem("x" * 5000)
    assert message is not None and "x" * 80 + "..." in message and "x" * 81 not in message


# -- x-tokentrail-trace: through the interceptor ------------------------------------------------------

@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
async def test_a_malformed_declaration_is_a_400_in_the_dialect_and_nothing_happens(over_engine, publisher,
                                                                                    dialect, stream):
    r, engine = await call(over_engine, dialect, {TRACE_HEADER: "subagent:no,commas"}, stream=stream)
    assert r.status_code == 400, r.text
    message = error_message(dialect, r)
    assert TRACE_HEADER in message and "'subagent:no,commas'" in message and "side[:LABEL]" in message
    assert publisher.all == []  # not even the call's intent
    assert engine.requests == []  # the engine was never called (not even for its model list)


async def test_a_declaration_sent_twice_is_refused(over_engine, publisher):
    engine = FakeVLLM()
    http, _ = await over_engine(engine)
    route, body = chat()
    r = await http.post(BASE.format(rid="t-2") + route, json=body,
                        headers=[(TRACE_HEADER, "main"), (TRACE_HEADER, "side:title")])
    assert r.status_code == 400 and "sent 2 times" in r.json()["error"]["message"]
    assert publisher.all == [] and engine.requests == []


async def test_the_evaluation_prefix_refuses_a_malformed_declaration_too(over_engine, publisher):
    engine = FakeVLLM()
    http, _ = await over_engine(engine)
    r = await http.get("/ng-rollout/t-3/v1/models", headers={TRACE_HEADER: "bogus"})
    assert r.status_code == 400 and TRACE_HEADER in r.json()["error"]["message"]
    assert engine.requests == [] and publisher.all == []


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("value", ["main", "subagent:code-reviewer", "side:title", "other:x:y z"])
async def test_a_valid_declaration_is_recorded_verbatim_and_never_forwarded(over_engine, publisher, dialect,
                                                                            value):
    r, engine = await call(over_engine, dialect, {TRACE_HEADER: value})
    assert r.status_code == 200, r.text
    (captured_call,) = captured(publisher)
    assert captured_call.facts.trace_declared == value
    assert engine.requests and all(TRACE_HEADER not in req["headers"] for req in engine.requests)


async def test_an_undeclared_call_records_no_trace(over_engine, publisher):
    r, _ = await call(over_engine, "chat")
    assert r.status_code == 200, r.text
    assert captured(publisher)[0].facts.trace_declared == ""


def test_the_engine_header_allow_list_drops_the_declaration():
    out = upstream_headers(Headers({TRACE_HEADER: "main", "content-type": "application/json"}), None)
    assert TRACE_HEADER not in out and out == {"content-type": "application/json"}


# -- opening_text_digests ------------------------------------------------------------------------

@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
async def test_every_dialect_digests_the_same_opening_text(over_engine, publisher, dialect, stream):
    r, _ = await call(over_engine, dialect, stream=stream)
    assert r.status_code == 200, r.text
    (captured_call,) = captured(publisher)
    digests = captured_call.facts.opening_text_digests
    # Each text part on its own: the Task prompt is matchable even after a <system-reminder> block.
    expected = [text_digest(PROMPT)] if dialect != "anthropic" else [text_digest(REMINDER), text_digest(PROMPT)]
    assert digests == expected


def test_the_opening_user_turn_only_its_text_parts_in_order():
    items = [{"role": "system", "content": "sys"},
             {"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "image_url", "image_url": {}},
                                          {"text": "two"}, {"type": "input_text", "text": "three"},
                                          {"type": "tool_result", "text": "not text"}, "junk"]},
             {"role": "system", "content": "passed over"}, {"role": "user", "content": "four"},
             {"role": "assistant", "content": "ok"}, {"role": "user", "content": "later"}]
    assert opening_text_digests(items) == [text_digest(t) for t in ("one", "two", "three", "four")]


def test_codexs_task_after_its_environment_context_is_in_the_opening_turn():
    # The shape Codex 0.171 sends a spawned agent (spawn_agent {"message": "child task: run echo child"}).
    items = [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex"}]},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<environment_context>"
                                                                                             "</environment_context>"}]},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "child task: run echo child"}]},
             {"type": "function_call", "name": "exec", "arguments": "{}", "call_id": "c1"},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "later"}]}]
    digests = opening_text_digests(items)
    assert digests == [text_digest("<environment_context></environment_context>"),
                       text_digest("child task: run echo child")]


def test_no_user_message_no_digests_and_at_most_64():
    assert opening_text_digests([{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}]) == []
    assert opening_text_digests([]) == []
    many = [{"role": "user", "content": [{"type": "text", "text": f"part {i}"} for i in range(100)]}]
    assert opening_text_digests(many) == [text_digest(f"part {i}") for i in range(MAX_OPENING_DIGESTS)]


def test_a_repeated_opening_is_normalised_once_and_the_memo_stays_bounded(monkeypatch):
    import producers.capture.trace_facts as facts

    normalised: list[str] = []

    def counting(text: str) -> str:
        normalised.append(text)
        return text_digest(text)

    monkeypatch.setattr(facts, "text_digest", counting)
    monkeypatch.setattr(facts, "_MEMO", facts._OpeningDigestMemo(2))
    long = "word  and\nword " * 3000
    turn = [{"role": "user", "content": [{"type": "text", "text": long}, {"type": "text", "text": "task a"}]}]
    for _ in range(3):  # every call of a rollout repeats its opening turn
        assert opening_text_digests(turn) == [text_digest(long), text_digest("task a")]
    assert normalised == [long, "task a"]
    # Texts differing in whitespace only have the same digest but are separate entries; the oldest goes.
    assert opening_text_digests([{"role": "user", "content": "task  a"}]) == [text_digest("task a")]
    assert len(facts._MEMO._digests) == 2  # "task a" and "task  a": the long text went first
    assert opening_text_digests(turn) == [text_digest(long), text_digest("task a")]
    assert normalised == [long, "task a", "task  a", long, "task a"]
    lone = "\ud800 surrogate"  # encoded as text_digest encodes it, never an error
    assert opening_text_digests([{"role": "user", "content": lone}]) == [text_digest(lone)]


async def test_a_responses_string_input_is_its_opening_message(over_engine, publisher):
    engine = FakeVLLM()
    http, _ = await over_engine(engine)
    r = await http.post(BASE.format(rid="t-4") + "/responses", json={"model": "gpt-x", "input": PROMPT})
    assert r.status_code == 200, r.text
    assert captured(publisher)[0].facts.opening_text_digests == [text_digest(PROMPT)]


# -- agent_name ----------------------------------------------------------------------------------

def codex_metadata(**fields) -> str:
    # Trimmed from what Codex 0.171 sent (compose/harnesses/codex), main agent unless overridden.
    base = {"session_id": "01a23537-05f6", "thread_id": "01a23537-05f6", "agent_name": "/root",
            "request_kind": "turn", "thread_source": "user", "turn_trigger": "exec", "model": "tokentrail-policy"}
    return json.dumps({**base, **fields})


CODEX_MAIN = {"x-codex-turn-metadata": codex_metadata(), "originator": "codex_exec"}
CODEX_SPAWNED = {"x-codex-turn-metadata": codex_metadata(thread_id="01a23537-0650", subagent_kind="thread_spawn",
                                                         thread_source="subagent", parent_thread_id="01a23537-05f6"),
                 "x-openai-subagent": "collab_spawn", "x-codex-parent-thread-id": "01a23537-05f6"}


@pytest.mark.parametrize(("headers", "name"), [
    ({}, ""),
    ({"x-claude-code-session-id": "s-1", "user-agent": "claude-cli/2.1.332"}, ""),  # Claude Code's main loop
    ({"x-claude-code-session-id": "s-1", "x-claude-code-agent-id": "ad50af8296437967b"}, "ad50af8296437967b"),
    (CODEX_MAIN, ""),  # agent_name "/root" is the main agent: it names no sub-agent
    (CODEX_SPAWNED, "thread_spawn"),
    ({"x-codex-turn-metadata": codex_metadata(agent_name="/root/explorer", thread_source="subagent")},
     "/root/explorer"),
    ({"x-codex-turn-metadata": codex_metadata(thread_source="subagent")}, "subagent"),
    ({"x-openai-subagent": "review"}, "review"),
    ({"x-openai-subagent": "compact"}, ""),  # Codex's compaction session: a compaction, not an agent
])
def test_only_a_header_that_marks_a_sub_agent_names_one(headers, name):
    assert agent_name(headers) == name


@pytest.mark.parametrize("metadata", ["not json", "[1, 2]", "null", '"/root/x"', '{"agent_name": 5}',
                                      '{"subagent_kind": ["x"]}', '{"agent_name": "/root/\u0000"}',
                                      "[" * 100_000, '{"subagent_kind": "' + "k" * 201 + '"}'])
def test_a_metadata_header_that_does_not_parse_names_nobody_and_never_raises(metadata):
    assert agent_name({"x-codex-turn-metadata": metadata}) == ""
    # a later header still counts
    assert agent_name({"x-codex-turn-metadata": metadata, "x-openai-subagent": "collab_spawn"}) == "collab_spawn"


def test_the_agent_headers_are_one_constant_in_preference_order():
    assert [h for h, _ in AGENT_HEADERS] == ["x-claude-code-agent-id", "x-codex-turn-metadata", "x-openai-subagent"]


@pytest.mark.parametrize(("headers", "name"), [(CODEX_MAIN, ""), (CODEX_SPAWNED, "thread_spawn"),
                                               ({"x-codex-turn-metadata": "{broken"}, "")])
async def test_the_agent_name_reaches_the_captured_call(over_engine, publisher, headers, name):
    r, _ = await call(over_engine, "responses", headers)
    assert r.status_code == 200, r.text  # a harness header that does not parse is never an error
    assert captured(publisher)[0].facts.agent_name == name


async def test_all_three_facts_on_one_streamed_claude_code_sub_agent_call(over_engine, publisher):
    r, _ = await call(over_engine, "anthropic", {TRACE_HEADER: "subagent:general-purpose",
                                                  "x-claude-code-agent-id": "ad50af8296437967b"}, stream=True)
    assert r.status_code == 200, r.text
    facts = captured(publisher)[0].facts
    assert facts.trace_declared == "subagent:general-purpose" and facts.agent_name == "ad50af8296437967b"
    assert text_digest(PROMPT) in facts.opening_text_digests
