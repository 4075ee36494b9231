"""The generated reasoning task set: deterministic, shipped as generated, loadable, and its answers verify."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from compose.collect import taskset
from compose.collect.tasks import Task, load_tasks
from compose.collect.verify import verify


@pytest.fixture(scope="module")
def shipped() -> list[Task]:
    return load_tasks(taskset.SHIPPED)


def _wrong(task: Task) -> str:
    """An answer that must not be accepted."""
    if task.verifier.kind == "choice":
        return "A" if task.answer != "A" else "B"
    if task.verifier.kind == "numeric":
        return str(task.answer + 1)
    return f"{task.answer}zz"


def test_the_shipped_file_is_the_generator_output_byte_for_byte():
    # Regenerating is the only way to change it: python -m compose.collect.taskset --out <SHIPPED>
    assert taskset.SHIPPED.read_bytes() == taskset.dumps(taskset.generate()).encode("utf-8")


def test_it_is_about_fifty_tasks_with_unique_ids_in_every_category(shipped):
    assert len(shipped) == 50
    assert len({t.id for t in shipped}) == 50
    assert Counter(t.id.split("-")[0] for t in shipped) == dict(taskset.CATEGORIES)
    assert sum(1 for t in shipped if t.files) == 8
    assert {t.verifier.kind for t in shipped} == {"numeric", "choice", "exact"}


def test_every_prompt_asks_for_the_answer_tag(shipped):
    assert all(t.prompt.endswith("Give your final answer as <answer>...</answer>.") for t in shipped)


def test_choice_tasks_have_four_options_and_file_tasks_name_their_file(shipped):
    for task in shipped:
        if task.verifier.kind == "choice":
            assert len(task.verifier.choices) == 4 and len(set(task.verifier.choices)) == 4
        if task.files:
            assert any(name in task.prompt for name in task.files), task.id


def test_every_task_accepts_its_answer_and_refuses_a_wrong_one(shipped):
    for task in shipped:
        right = verify(task, f"Let me work it out.\n<answer>{task.answer}</answer>")
        wrong = verify(task, f"<answer>{_wrong(task)}</answer>")
        assert (right.reward, wrong.reward) == (1.0, 0.0), (task.id, right.detail, wrong.detail)


def test_unit_answers_verify_when_written_with_their_unit(shipped):
    units = [t for t in shipped if t.id.startswith("units-")]
    assert units
    for task in units:
        assert verify(task, f"<answer>{task.answer} {task.metadata['unit']}</answer>").reward == 1.0, task.id


def test_the_computed_answers_are_right_for_known_shapes(shipped):
    # Independent of the generator's arithmetic: recompute the answer from the task's own data.
    for task in shipped:
        if "numbers.txt" in task.files:
            assert task.answer == sum(int(x) for x in task.files["numbers.txt"].split())
        if "words.txt" in task.files:
            words = task.files["words.txt"].split()
            assert task.answer == max(words, key=len) and [len(w) for w in words].count(len(task.answer)) == 1
        if task.verifier.kind == "choice" and "prime" in task.prompt:
            prime = int(task.verifier.choices[ord(task.answer) - ord("A")])
            assert all(prime % d for d in range(2, prime))


def test_generate_is_deterministic_and_seeded():
    assert taskset.generate(3, 20) == taskset.generate(3, 20)
    assert taskset.generate(3, 20) != taskset.generate(4, 20)
    assert [len(taskset.generate(0, n)) for n in (1, 7, 50, 120)] == [1, 7, 50, 120]
    with pytest.raises(ValueError):
        taskset.generate(0, 0)


def test_main_writes_sorted_key_jsonl(tmp_path, capsys):
    out = tmp_path / "set.jsonl"
    assert taskset.main(["--seed", "5", "--n", "12", "--out", str(out)]) == 0
    lines = out.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 12
    assert all(line == json.dumps(json.loads(line), sort_keys=True, ensure_ascii=False) for line in lines)
    assert len(load_tasks(out)) == 12
    assert taskset.main(["--seed", "5", "--n", "12"]) == 0
    assert capsys.readouterr().out == out.read_text(encoding="utf-8")
