"""The task file: what loads, what each Gym row shape becomes, and every refusal naming path:line and the field."""

from __future__ import annotations

import json

import pytest

from compose.collect.tasks import Task, TaskError, VerifierSpec, load_tasks, tasks_digest
from schemas.errors import ConfigError

GOOD = {"id": "t1", "prompt": "What is 2+2?", "answer": 4}


def _write(tmp_path, *rows, name="tasks.jsonl"):
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def _one(tmp_path, row) -> Task:
    (task,) = load_tasks(_write(tmp_path, row))
    return task


def _refusal(tmp_path, row) -> str:
    """The message for ``row`` written as line 2, after a good row, so the line number is checked too."""
    path = _write(tmp_path, GOOD, row)
    with pytest.raises(TaskError) as info:
        load_tasks(path)
    assert isinstance(info.value, ConfigError)
    message = str(info.value)
    assert f"{path}:2:" in message
    return message


def test_a_native_row_loads_with_its_defaults(tmp_path):
    task = _one(tmp_path, GOOD)
    assert (task.id, task.prompt, task.answer, task.line) == ("t1", "What is 2+2?", 4, 1)
    assert task.verifier == VerifierSpec(kind="numeric", tolerance=1e-6, rel_tolerance=0.0)
    assert (task.tools, task.files, task.metadata, task.rollout_id) == ((), {}, {}, None)


@pytest.mark.parametrize("extra, kind", [
    ({"answer": "Paris"}, "exact"),
    ({"answer": 2.5}, "numeric"),
    ({"answer": True, "verifier": {"target": "m:f"}}, "custom"),
    ({"answer": "B", "choices": ["x", "y", "z"]}, "choice"),
    ({"answer": ["4", "four"]}, "exact"),
])
def test_the_default_kind_follows_from_the_row(tmp_path, extra, kind):
    assert _one(tmp_path, {**GOOD, **extra}).verifier.kind == kind


def test_every_optional_field_is_read(tmp_path):
    row = {"id": "file-1", "prompt": "Sum numbers.txt", "answer": 6,
           "verifier": {"kind": "numeric", "tolerance": 0.5, "rel_tolerance": 0.01},
           "tools": [{"type": "function", "name": "f"}], "files": {"data/numbers.txt": "1\n5\n"},
           "metadata": {"source": "x"}, "_ng_rollout_id": "step1.file-1-r0"}
    task = _one(tmp_path, row)
    assert task.verifier == VerifierSpec(kind="numeric", tolerance=0.5, rel_tolerance=0.01)
    assert task.tools == ({"type": "function", "name": "f"},)
    assert task.files == {"data/numbers.txt": "1\n5\n"}
    assert task.metadata == {"source": "x"}
    assert task.rollout_id == "step1.file-1-r0"


def test_choice_answers_may_be_letters_or_option_texts(tmp_path):
    rows = [{"id": f"c{i}", "prompt": "Capital of France?", "answer": a, "verifier": {"kind": "choice",
             "choices": ["Rome", "Paris"]}} for i, a in enumerate(["B", "paris", ["A", "Paris"]])]
    assert [t.answer for t in load_tasks(_write(tmp_path, *rows))] == ["B", "paris", ["A", "Paris"]]


def test_a_custom_target_is_not_imported_at_load(tmp_path):
    task = _one(tmp_path, {**GOOD, "answer": None, "verifier": {"kind": "custom", "target": "no_such_module_x:check"}})
    assert (task.verifier.target, task.answer) == ("no_such_module_x:check", None)


@pytest.mark.parametrize("task_id", ["a" * 64, "0", "run_7.task-3", "A.b_c-d"])
def test_ids_in_the_rollout_alphabet_up_to_64_characters_load(tmp_path, task_id):
    assert _one(tmp_path, {**GOOD, "id": task_id}).id == task_id


def test_blank_lines_are_skipped_and_lines_counted(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("\n" + json.dumps(GOOD) + "\n   \n" + json.dumps({**GOOD, "id": "t2"}) + "\n\n")
    assert [t.line for t in load_tasks(path)] == [2, 4]


def test_a_line_separator_inside_a_string_does_not_split_the_row(tmp_path):
    task = _one(tmp_path, '{"id": "t1", "prompt": "a\u2028b", "answer": "x"}')
    assert task.prompt == "a\u2028b"


@pytest.mark.parametrize("row, names", [
    ('{"id": "t2", "prompt": ', "invalid JSON"),
    ("[1, 2]", "JSON object"),
    ('{"id": "t2", "prompt": "p", "answer": NaN}', "NaN"),
    ('{"id": "t2", "prompt": "p", "answer": 1e400}', "infinite"),
    ('{"id": "t2", "id": "t3", "prompt": "p", "answer": 1}', "'id' appears twice"),
    ({"prompt": "p", "answer": 1}, "'id'"),
    ({"id": "t2", "answer": 1}, "'prompt'"),
    ({"id": "t2", "prompt": "p"}, "'answer'"),
    ({"id": "t2", "prompt": "  ", "answer": 1}, "'prompt'"),
    ({"id": 7, "prompt": "p", "answer": 1}, "'id'"),
    ({"id": "bad id", "prompt": "p", "answer": 1}, "'id'"),
    ({"id": ".hidden", "prompt": "p", "answer": 1}, "'id'"),
    ({"id": "a" * 65, "prompt": "p", "answer": 1}, "'id'"),
    ({"id": "t2", "prompt": "p", "answer": 1, "question": "q"}, "'question'"),
    ({"id": "t2", "prompt": "p", "answer": None}, "'answer'"),
    ({"id": "t2", "prompt": "p", "answer": True}, "'answer'"),
    ({"id": "t2", "prompt": "p", "answer": []}, "'answer'"),
    ({"id": "t2", "prompt": "p", "answer": {"x": 1}}, "'answer'"),
    ({"id": "t2", "prompt": "p", "answer": "many", "verifier": "numeric"}, "'answer'"),
    ({"id": "t2", "prompt": "p", "answer": "E", "choices": ["a", "b", "c", "d"]}, "'answer'"),
    ({"id": "t2", "prompt": "p", "answer": "A", "choices": "a,b"}, "'choices'"),
    ({"id": "t2", "prompt": "p", "answer": "A", "choices": ["a", "A"]}, "'choices'"),
    ({"id": "t2", "prompt": "p", "answer": "A", "verifier": "choice"}, "'choices'"),
    ({"id": "t2", "prompt": "p", "answer": "A", "choices": ["a", "b"], "verifier": {"choices": ["a", "b"]}},
     "'choices'"),
    ({"id": "t2", "prompt": "p", "answer": "x", "choices": ["x", "y"], "verifier": "exact"}, "'verifier.choices'"),
    ({"id": "t2", "prompt": "p", "answer": "x", "verifier": {"kind": "exact", "tolerance": 0.1}}, "verifier.tolerance"),
    ({"id": "t2", "prompt": "p", "answer": 1, "verifier": {"tolerance": -1}}, "verifier.tolerance"),
    ({"id": "t2", "prompt": "p", "answer": 1, "verifier": {"rel_tolerance": "0.1"}}, "verifier.rel_tolerance"),
    ({"id": "t2", "prompt": "p", "answer": "x", "verifier": {"case_sensitive": "yes"}}, "verifier.case_sensitive"),
    ({"id": "t2", "prompt": "p", "answer": 1, "verifier": "fuzzy"}, "verifier.kind"),
    ({"id": "t2", "prompt": "p", "answer": 1, "verifier": {"kind": "numeric", "tol": 1}}, "'tol'"),
    ({"id": "t2", "prompt": "p", "answer": 1, "verifier": 3}, "'verifier'"),
    ({"id": "t2", "prompt": "p", "answer": 1, "verifier": "custom"}, "verifier.target"),
    ({"id": "t2", "prompt": "p", "answer": 1, "verifier": {"target": "no colon"}}, "verifier.target"),
    ({"id": "t2", "prompt": "p", "answer": 1, "files": {"/etc/passwd": "x"}}, "'files'"),
    ({"id": "t2", "prompt": "p", "answer": 1, "files": {"a/../../x": "x"}}, "a/../../x"),
    ({"id": "t2", "prompt": "p", "answer": 1, "files": {"C:\\x": "x"}}, "'files'"),
    ({"id": "t2", "prompt": "p", "answer": 1, "files": {"a.txt": 5}}, "'files'"),
    ({"id": "t2", "prompt": "p", "answer": 1, "files": ["a.txt"]}, "'files'"),
    ({"id": "t2", "prompt": "p", "answer": 1, "tools": {"name": "f"}}, "'tools'"),
    ({"id": "t2", "prompt": "p", "answer": 1, "metadata": [1]}, "'metadata'"),
    ({"id": "t2", "prompt": "p", "answer": 1, "_ng_rollout_id": "has space"}, "'_ng_rollout_id'"),
])
def test_each_refusal_names_the_line_and_the_field(tmp_path, row, names):
    message = _refusal(tmp_path, row)
    assert names in message
    assert "Fix" in message or "must match" in message  # it says what to do


def test_a_long_value_is_shortened_in_the_message(tmp_path):
    message = _refusal(tmp_path, {"id": "x y" * 500, "prompt": "p", "answer": 1})
    assert "(1502 characters)" in message and len(message) < 600


@pytest.mark.parametrize("key, rows", [
    ("id", [GOOD, {**GOOD, "id": "t3"}, GOOD]),
    ("_ng_rollout_id", [{**GOOD, "_ng_rollout_id": "r1"}, {**GOOD, "id": "t2"},
                        {**GOOD, "id": "t3", "_ng_rollout_id": "r1"}]),
])
def test_duplicates_name_both_lines(tmp_path, key, rows):
    path = _write(tmp_path, *rows)
    with pytest.raises(TaskError, match=rf"{path}:3: field '{key}' repeats line 1 \({path}:1\)"):
        load_tasks(path)


@pytest.mark.parametrize("text", ["", "\n  \n\n"])
def test_an_empty_file_is_refused(tmp_path, text):
    path = tmp_path / "empty.jsonl"
    path.write_text(text)
    with pytest.raises(TaskError, match="no tasks"):
        load_tasks(path)


def test_a_missing_file_is_a_task_error(tmp_path):
    with pytest.raises(TaskError, match="cannot read"):
        load_tasks(tmp_path / "nope.jsonl")


# --- NeMo Gym rows -------------------------------------------------------------------------------

def test_a_gym_row_with_a_string_input(tmp_path):
    task = _one(tmp_path, {"responses_create_params": {"input": "What is 6*7?"},
                           "verifier_metadata": {"expected_answer": 42, "difficulty": "easy"},
                           "agent_ref": {"name": "math"}, "_ng_task_index": 3})
    assert (task.id, task.prompt, task.answer, task.verifier.kind) == ("row1", "What is 6*7?", 42, "numeric")
    assert task.metadata == {"difficulty": "easy", "agent_ref": {"name": "math"}, "_ng_task_index": 3}


def test_a_gym_row_takes_the_last_user_message_and_its_tools(tmp_path):
    tools = [{"type": "function", "name": "calc", "parameters": {"type": "object"}}]
    row = {"id": "g-1", "responses_create_params": {
        "input": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "old question"},
                  {"role": "assistant", "content": "old answer"},
                  {"role": "user", "type": "message", "content": [{"type": "input_text", "text": "Part one."},
                                                                  {"type": "input_image", "image_url": "x"},
                                                                  {"type": "text", "text": "Part two."}]}],
        "tools": tools, "temperature": 0.5}, "verifier_metadata": {"answer": "ok"}}
    task = _one(tmp_path, row)
    assert (task.id, task.prompt, task.tools) == ("g-1", "Part one.\nPart two.", tuple(tools))
    assert task.metadata == {"responses_create_params": {"temperature": 0.5}}


@pytest.mark.parametrize("meta, answer, rest", [
    ({"expected_answer": "a", "answer": "b", "ground_truth": "c"}, "a", {"answer": "b", "ground_truth": "c"}),
    ({"answer": "b", "ground_truth": "c"}, "b", {"ground_truth": "c"}),
    ({"ground_truth": "c"}, "c", {}),
    ({"expected_answer": None, "ground_truth": "c"}, "c", {"expected_answer": None}),
])
def test_the_gym_answer_comes_from_the_first_key_present(tmp_path, meta, answer, rest):
    task = _one(tmp_path, {"id": "g", "responses_create_params": {"input": "q"}, "verifier_metadata": meta})
    assert (task.answer, task.metadata) == (answer, rest)


def test_a_gym_id_comes_from_the_row_then_the_metadata_then_the_line(tmp_path):
    rows = [{"id": 17, "responses_create_params": {"input": "q"}, "verifier_metadata": {"answer": 1, "id": "m"}},
            {"responses_create_params": {"input": "q"}, "verifier_metadata": {"answer": 1, "id": "m"}},
            {"responses_create_params": {"input": "q"}, "verifier_metadata": {"answer": 1}}]
    tasks = load_tasks(_write(tmp_path, *rows))
    assert [t.id for t in tasks] == ["17", "m", "row3"]
    assert tasks[0].metadata == {"id": "m"} and tasks[1].metadata == {}


@pytest.mark.parametrize("key, options", [("options", [{"A": "Oslo"}, {"B": "Bern"}]), ("choices", ["Oslo", "Bern"])])
def test_gym_options_make_a_choice_task(tmp_path, key, options):
    task = _one(tmp_path, {"responses_create_params": {"input": "Capital of Switzerland?"},
                           "verifier_metadata": {"expected_answer": "B", key: options}})
    assert task.verifier == VerifierSpec(kind="choice", choices=("Oslo", "Bern"))
    assert task.metadata == {}


def test_a_gym_row_keeps_its_rollout_id_and_may_use_a_custom_verifier_without_answer(tmp_path):
    task = _one(tmp_path, {"responses_create_params": {"input": "q"}, "_ng_rollout_id": "gym.r-1",
                           "verifier": {"target": "mod:fn"}})
    assert (task.rollout_id, task.answer, task.verifier.kind) == ("gym.r-1", None, "custom")


@pytest.mark.parametrize("row, names", [
    ({"responses_create_params": {"input": "q"}}, "'answer' is null or an empty list"),
    ({"responses_create_params": {"input": "q"}, "verifier_metadata": [1]}, "'verifier_metadata'"),
    ({"responses_create_params": "q", "verifier_metadata": {"answer": 1}}, "'responses_create_params'"),
    ({"responses_create_params": {"input": [{"role": "assistant", "content": "hi"}]},
      "verifier_metadata": {"answer": 1}}, "responses_create_params.input"),
    ({"responses_create_params": {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
      "verifier_metadata": {"answer": 1}}, "responses_create_params.input"),
    ({"responses_create_params": {"input": ""}, "verifier_metadata": {"answer": 1}}, "responses_create_params.input"),
    ({"responses_create_params": {"input": "q", "tools": "calc"}, "verifier_metadata": {"answer": 1}}, "'tools'"),
    ({"id": "bad id", "responses_create_params": {"input": "q"}, "verifier_metadata": {"answer": 1}}, "'id'"),
    ({"id": 1.5, "responses_create_params": {"input": "q"}, "verifier_metadata": {"answer": 1}}, "'id'"),
    ({"responses_create_params": {"input": "q"}, "verifier_metadata": {"answer": 1, "k": 1}, "k": 2}, "'k'"),
])
def test_gym_refusals_name_the_line_and_the_field(tmp_path, row, names):
    assert names in _refusal(tmp_path, row)


# --- the digest ------------------------------------------------------------------------------------

ROWS = [{"id": "a", "prompt": "What is 2+2?", "answer": 4},
        {"id": "b", "prompt": "Capital of France?", "answer": "B", "choices": ["Rome", "Paris"],
         "files": {"x.txt": "é"}, "metadata": {"k": [1, 2]}}]


def test_the_digest_is_pinned(tmp_path):
    # Golden: the collector stores it to refuse resuming a run on another task file; it must not drift.
    assert tasks_digest(load_tasks(_write(tmp_path, *ROWS))) == \
        "e39df1e517301136726e2aba4c8f74b8529529cea4d385142d97fa9ff57ec206"


def test_the_digest_ignores_order_and_blank_lines_but_not_content(tmp_path):
    base = tasks_digest(load_tasks(_write(tmp_path, *ROWS)))
    assert tasks_digest(load_tasks(_write(tmp_path, "", ROWS[1], "", ROWS[0], name="b.jsonl"))) == base
    changed = [ROWS[0], {**ROWS[1], "answer": "A"}]
    assert tasks_digest(load_tasks(_write(tmp_path, *changed, name="c.jsonl"))) != base
    tolerant = [{**ROWS[0], "verifier": {"tolerance": 0.5}}, ROWS[1]]
    assert tasks_digest(load_tasks(_write(tmp_path, *tolerant, name="d.jsonl"))) != base
