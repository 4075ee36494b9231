"""``tokentrail bench rebuild``'s tree case: the synthesised tree is the one the figures claim to time."""

from __future__ import annotations

import argparse
import re
from collections import Counter

import pytest

from compose.tools.bench import rebuild as bench
from compose.tools.bench._rebuild_tree import synth_tree_snapshot, unique_tokens
from compose.tools.bench.budgets import budget_line
from consumers.rebuild import RebuildRules, rebuild
from consumers.rebuild.tree import tree_sizes

CALLS, TOKENS = 30, 3_000  # the smallest sizes the shape comfortably fits


@pytest.fixture(scope="module")
def tree():
    return synth_tree_snapshot(CALLS, TOKENS)


def test_the_tree_rebuilds_into_one_main_eight_subagents_and_two_compactions(tree):
    out = rebuild(tree, RebuildRules(delivery_mode="traces", project_response=False))
    assert not out.mask_sample, out.mask_reasons
    assert Counter(t.kind for t in out.traces) == {"main": 1, "subagent": 8, "compaction": 2}
    assert not any(t.mask_sample for t in out.traces)
    by_kind = {t.kind: [] for t in out.traces}
    for t in out.traces:
        by_kind[t.kind].append(t)
    # Each sub-agent is found by its Agent call (not a header), each segment by its summary.
    assert {t.classified_by for t in by_kind["subagent"]} == {"agent_tool"}
    assert sorted(t.attachment.tool_call_id for t in by_kind["subagent"]) == [f"agent-{k}" for k in range(8)]
    assert [(t.classified_by, t.segment) for t in by_kind["compaction"]] == [("summary", 1), ("summary", 2)]
    assert len(tree.calls) == CALLS


def test_the_compact_tree_stores_each_unique_token_once(tree):
    out = rebuild(tree, RebuildRules(delivery_mode="traces", project_response=False))
    assert unique_tokens(tree) == TOKENS
    assert tree_sizes(out).stored_tokens == TOKENS
    # Terminal mode delivers only the last segment: fewer tokens than the tree.
    terminal = rebuild(tree, RebuildRules(project_response=False))
    assert not terminal.mask_sample and len(terminal.trajectory.token_ids) < TOKENS


def test_too_few_calls_or_tokens_are_refused_by_name():
    with pytest.raises(ValueError, match="n_calls=5"):
        synth_tree_snapshot(5, TOKENS)
    with pytest.raises(ValueError, match="n_tokens=40"):
        synth_tree_snapshot(CALLS, 40)


def run_bench(capsys, tree_on: bool) -> str:
    args = argparse.Namespace(calls=[CALLS], tokens=[TOKENS], repeat=1, gym_src=None, tree=tree_on)
    assert bench.main(args) == 0
    return capsys.readouterr().out


def test_the_bench_prints_the_tree_figures_and_no_tree_leaves_them_out(capsys):
    with_tree = run_bench(capsys, True)
    assert "tree: 30 calls / 3000 tokens, 11 traces: 1 main, 8 subagent, 2 compaction" in with_tree
    assert (f"tree size: the compact tree stores {TOKENS} tokens; the snapshot holds {TOKENS} unique tokens "
            "(1.000x); written out whole") in with_tree
    assert "traces mode" in with_tree and "of 2x" in with_tree
    without = run_bench(capsys, False)
    assert "tree" not in without
    # The tree adds its four lines after the existing output, which keeps its shape; the BUDGET lines come last.
    assert [line.split()[0] for line in figures(with_tree)[:-4]] == [line.split()[0] for line in figures(without)]
    assert [line.split()[1] for line in budgets(with_tree)] == ["rebuild.projection_ratio", "rebuild.tree_ratio"]
    assert [line.split()[1] for line in budgets(without)] == ["rebuild.projection_ratio"]


def figures(out: str) -> list[str]:
    return [line for line in out.splitlines() if not line.startswith("BUDGET ")]


def budgets(out: str) -> list[str]:
    lines = out.splitlines()
    found = [line for line in lines if line.startswith("BUDGET ")]
    assert lines[-len(found):] == found  # the last lines, for a table of every benchmark to collect
    return found


BUDGET = re.compile(r"BUDGET [a-z_.]+ value=[0-9.]+ budget=<=[0-9.]+( baseline=[0-9.]+ ratio=[0-9.]+)? ok=(true|false)")


def test_each_budget_line_has_the_collected_format(capsys):
    out = run_bench(capsys, True)
    assert all(BUDGET.fullmatch(line) for line in budgets(out)), budgets(out)
    # The compact budget is set at 200 calls / 131072 tokens: a smaller rollout is not judged against it.
    assert "rebuild.compact_ms" not in out and "not judged at 30 calls / 3000 tokens" in out


def test_budget_line_judges_an_upper_bound_and_a_ratio_figure_keeps_its_own_ratio():
    assert budget_line("rebuild.compact_ms", 4.2, 5.0) == "BUDGET rebuild.compact_ms value=4.200 budget=<=5 ok=true"
    # The projection and tree figures are themselves ratios to their baseline: the ratio column is the value.
    assert budget_line("rebuild.projection_ratio", 1.62, 1.5, baseline=57.031, ratio=1.62) == (
        "BUDGET rebuild.projection_ratio value=1.620 budget=<=1.5 baseline=57.031 ratio=1.620 ok=false")
