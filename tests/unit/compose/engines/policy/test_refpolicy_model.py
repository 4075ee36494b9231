"""The table model and the scripted agent: exact scoring, canonical output, decisions."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compose.engines.policy import tokenizer as tk
from compose.engines.policy.agent import build_arguments, decide_tool_call
from compose.engines.policy.engine import PolicyEngine
from compose.engines.policy.model import PolicyModel
from compose.engines.policy.parsing import parse_output
from compose.engines.policy.settings import PolicySettings
from compose.engines.policy.testkit import BASH, READ, TOOLS, user_turn
from compose.engines.policy.words import WORDS

ENGINE = PolicyEngine(PolicySettings())
REASONING = PolicyEngine(PolicySettings(reasoning=True))


def run(engine: PolicyEngine, **body):
    job = engine.prepare({"messages": user_turn(), **body})
    return job, engine.generate(job)


def test_table_rows_are_log_softmax():
    table = ENGINE.model.table(0)
    # float32 like vLLM's log-probs: a row normalises to within float32 rounding over the vocabulary
    assert table.dtype == np.float32 and table.shape == (1024, ENGINE.tok.vocab_size)
    np.testing.assert_allclose(np.logaddexp.reduce(table.astype(np.float64), axis=1), 0.0, atol=1e-5)


def test_vectorised_rows_equal_scalar_rows():
    model = ENGINE.model
    ids = [5, 17, 3000, 2, 1, 999, 42, 7, 7, 7]
    for version in (0, 1, 12345):
        rows = model.rows_for(ids, 0, version).tolist()
        padded = [model.pad] * 3 + ids
        assert rows == [model.row(*padded[i:i + 3], version) for i in range(len(ids))]


@pytest.mark.parametrize("engine", [ENGINE, REASONING], ids=["plain", "reasoning"])
@pytest.mark.parametrize("tools", [None, TOOLS], ids=["answer", "tool-call"])
@pytest.mark.parametrize("seed", [0, 1, 7])
def test_scoring_reproduces_every_generated_logprob_exactly(engine, tools, seed):
    job, gen = run(engine, tools=tools, seed=seed, temperature=0.8, top_p=0.9)
    full = job.prompt_ids + gen.token_ids
    scored = engine.score(full, len(job.prompt_ids))
    assert scored == gen.logprobs  # ==, not approx: the same table lookups
    assert all(isinstance(x, float) and x < 0 for x in scored)


def test_scoring_under_another_weight_version_differs():
    job, gen = run(ENGINE, seed=3)
    full = job.prompt_ids + gen.token_ids
    assert ENGINE.score(full, len(job.prompt_ids), version=1) != gen.logprobs
    assert ENGINE.score(full, len(job.prompt_ids), version=0) == gen.logprobs


def test_weight_version_changes_generation_and_scores_under_its_own_table():
    engine = PolicyEngine(PolicySettings(weight_version=4))
    job, gen = run(engine, seed=5)
    assert gen.weight_version == 4
    assert engine.score(job.prompt_ids + gen.token_ids, len(job.prompt_ids), 4) == gen.logprobs
    _, gen0 = run(ENGINE, seed=5)
    assert gen0.logprobs != gen.logprobs


def test_model_rejects_bad_scoring_input():
    with pytest.raises(ValueError):
        ENGINE.model.score([1, 2], 3, 0)
    with pytest.raises(ValueError):
        ENGINE.model.score([1, ENGINE.tok.vocab_size], 0, 0)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32),
    temperature=st.sampled_from([0.0, 0.3, 1.0, 1.7]),
    top_p=st.sampled_from([0.2, 0.9, 1.0]),
    top_k=st.sampled_from([0, 5]),
    reasoning=st.booleans(),
    ignore_eos=st.booleans(),
    tools=st.sampled_from([None, TOOLS]),
)
def test_generated_ids_are_canonical(seed, temperature, top_p, top_k, reasoning, ignore_eos, tools):
    engine = REASONING if reasoning else ENGINE
    body = dict(seed=seed, temperature=temperature, top_p=top_p, top_k=top_k, ignore_eos=ignore_eos,
                max_tokens=64, tools=tools)
    _, gen = run(engine, **body)
    tok = engine.tok
    assert tok.encode(tok.decode(gen.token_ids)) == gen.token_ids
    text = tok.decode(gen.token_ids, skip_special_tokens=True)
    assert text.strip()


def test_drift_emits_a_non_canonical_split_with_the_same_text():
    messages = user_turn("Say something. [[fault:drift]]")
    job = ENGINE.prepare({"messages": messages, "seed": 11})
    gen = ENGINE.generate(job)
    text = ENGINE.tok.decode(gen.token_ids)
    assert ENGINE.tok.encode(text) != gen.token_ids
    clean = ENGINE.generate(ENGINE.prepare({"messages": user_turn("Say something."), "seed": 11}))
    assert ENGINE.tok.encode(ENGINE.tok.decode(clean.token_ids)) == clean.token_ids
    assert ENGINE.score(job.prompt_ids + gen.token_ids, len(job.prompt_ids)) == gen.logprobs


def test_same_request_same_output_and_seed_matters():
    a = run(ENGINE, seed=1)[1]
    b = run(ENGINE, seed=1)[1]
    c = run(ENGINE, seed=2)[1]
    assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
    assert a.token_ids != c.token_ids
    # without a seed the prompt decides
    assert run(ENGINE)[1].token_ids == run(ENGINE)[1].token_ids


def test_greedy_word_choice_ignores_the_seed():
    # the seed still drives the scripted sentence length, not which word is chosen
    a = run(ENGINE, seed=1, temperature=0)[1].token_ids
    b = run(ENGINE, seed=2, temperature=0)[1].token_ids
    n = min(len(a), len(b)) - 2  # before the "." and <|im_end|> of the shorter one
    assert n >= 7 and a[:n] == b[:n]


def test_answer_is_a_short_sentence_ending_in_im_end():
    _, gen = run(ENGINE, seed=4)
    assert gen.token_ids[-1] == tk.IM_END and gen.finish_reason == "stop"
    assert 8 <= len(gen.token_ids) - 1 <= 40
    text = ENGINE.tok.decode(gen.token_ids[:-1])
    assert text[0].isupper() and text.endswith(".")


def test_tool_call_tokens_are_the_encoded_json_body():
    job, gen = run(ENGINE, tools=[BASH], seed=1)
    tok = ENGINE.tok
    assert gen.token_ids[0] == tk.TOOL_CALL and gen.token_ids[-2:] == [tk.TOOL_CALL_END, tk.IM_END]
    body = '{"name": "Bash", "arguments": {"command": "echo tokentrail-1"}}'
    assert gen.token_ids[1:-2] == tok.encode(body)
    parsed = parse_output(tok, gen.token_ids, tools_enabled=True)
    assert [(n, a) for _, n, a in parsed.tool_calls] == [("Bash", '{"command": "echo tokentrail-1"}')]
    assert parsed.content is None


def test_max_tokens_cuts_with_finish_length():
    _, gen = run(ENGINE, tools=[BASH], max_tokens=5)
    assert len(gen.token_ids) == 5 and gen.finish_reason == "length"
    parsed = parse_output(ENGINE.tok, gen.token_ids, tools_enabled=True)
    assert parsed.tool_calls == [] and parsed.content.startswith("<tool_call>")


def test_ignore_eos_generates_exactly_max_tokens():
    for tools in (None, [BASH]):
        _, gen = run(ENGINE, tools=tools, max_tokens=512, ignore_eos=True)
        assert len(gen.token_ids) == 512 and gen.finish_reason == "length"
        assert tk.IM_END not in gen.token_ids


def test_stop_string_and_stop_token_ids():
    _, base = run(ENGINE, seed=9)
    word = ENGINE.tok.token_str(base.token_ids[3])
    _, gen = run(ENGINE, seed=9, stop=[word])
    assert gen.finish_reason == "stop" and gen.stop_reason == word
    assert gen.token_ids == base.token_ids[:4]
    _, gen = run(ENGINE, seed=9, stop_token_ids=[base.token_ids[2]])
    assert gen.token_ids == base.token_ids[:3] and gen.stop_reason == base.token_ids[2]


# -- the scripted decision --------------------------------------------------------

def conversation(tool_results: int, directive: str = "") -> list[dict]:
    messages = user_turn("Do the task. " + directive)
    for i in range(tool_results):
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": "Bash", "arguments": "{}"}}]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": "ok"})
    return messages


RNG = np.random.default_rng(0)


@pytest.mark.parametrize("done,directive,calls", [
    (0, "", True), (1, "", True), (2, "", False),
    (0, "#tool-calls=0", False), (2, "#tool-calls=3", True), (3, "#tool-calls=3", False),
])
def test_tool_calls_until_k_results_since_the_last_user_message(done, directive, calls):
    decision = decide_tool_call(conversation(done, directive), TOOLS, "auto", 2, RNG)
    assert (decision is not None) == calls


def test_results_before_the_last_user_message_do_not_count():
    messages = conversation(2) + [{"role": "user", "content": "Now again."}]
    assert decide_tool_call(messages, TOOLS, "auto", 2, RNG) is not None


def test_tool_choice_rules():
    done = conversation(5)
    assert decide_tool_call(conversation(0), TOOLS, "none", 2, RNG) is None
    assert decide_tool_call(done, TOOLS, "required", 2, RNG).name == "Bash"
    named = {"type": "function", "function": {"name": "Read"}}
    assert decide_tool_call(done, TOOLS, named, 2, RNG).name == "Read"
    assert decide_tool_call(conversation(0), None, "auto", 2, RNG) is None


def test_tool_selection_order():
    assert decide_tool_call(conversation(0), TOOLS, "auto", 2, RNG).name == "Bash"
    assert decide_tool_call(conversation(0, "#tool=Read"), TOOLS, "auto", 2, RNG).name == "Read"
    assert decide_tool_call(conversation(0, "#tool=Nope"), TOOLS, "auto", 2, RNG).name == "Bash"
    assert decide_tool_call(conversation(0), [READ], "auto", 2, RNG).name == "Read"


def test_the_gemini_clis_shell_tool_is_picked_over_the_first_tool():
    # The Gemini CLI offers update_topic, list_directory, ... before run_shell_command.
    shell = {"type": "function", "function": {"name": "run_shell_command", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}, "description": {"type": "string"}},
        "required": ["command"]}}}
    decision = decide_tool_call(conversation(0), [READ, shell], "auto", 2, RNG)
    assert (decision.name, decision.arguments) == ("run_shell_command", '{"command": "echo tokentrail-1"}')
    assert decide_tool_call(conversation(0), [READ, shell, BASH], "auto", 2, RNG).name == "Bash"


def test_arguments_from_the_schema_are_json_dumps_text():
    decision = decide_tool_call(conversation(1), [READ], "auto", 2, np.random.default_rng(3))
    args = json.loads(decision.arguments)
    assert list(args) == ["file_path", "limit", "verbose", "mode", "label"]
    assert args["file_path"] == "/tmp/tokentrail-2.txt"
    assert (args["limit"], args["verbose"], args["mode"]) == (1, False, "text")
    assert args["label"] in WORDS
    assert decision.arguments == json.dumps(args, ensure_ascii=False)


def test_build_arguments_command_numbering():
    schema = BASH["function"]["parameters"]
    assert build_arguments(schema, 3, RNG) == {"command": "echo tokentrail-3"}
    assert build_arguments({}, 1, RNG) == {}


def test_model_is_independent_of_vocab_options():
    small = PolicyModel(500, rows=16)
    assert small.table(0).shape == (16, 500)
    assert small.score([1, 2, 3], 1, 0) == small.score([1, 2, 3], 1, 0)
