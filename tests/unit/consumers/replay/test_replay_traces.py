"""``tokentrail replay`` on the traces delivery, without a broker: the trace tree in the
explanation, what a traces rule file changes, traces per kind in the summary, ``--delivery``.

The rollout: a main conversation that starts a sub-agent (an ``Agent`` tool call), forks
once, and ends in a summary; a compaction segment continuing from that summary answers
the harness; plus a short tool-less side call and a stray unresolved root (masked).
"""

from __future__ import annotations

import argparse
import json
from html.parser import HTMLParser

import pytest

import consumers.replay.eventlog
from consumers.rebuild import RebuildRules, rebuild
from consumers.replay import cli as replay_cli
from consumers.replay.eventlog import LoggedEvent
from consumers.replay.explain import explain, trace_changes
from consumers.replay.report_html import render_html
from consumers.replay.rollouts import fold_records, rule_changes
from consumers.replay.summary import render_text, summarize
from schemas.codec import encode_event
from schemas.hashing import text_digest
from schemas.kafka.topics import key_for
from tests.factories import event
from tests.unit.consumers.support import child, declared, root, unresolved

TRACES = RebuildRules(delivery_mode="traces")
T0 = 1_700_000_000_000


def cid(tag: str) -> str:
    return tag + "0" * (32 - len(tag))


def agent_call_items(tool_call_id: str) -> str:
    return json.dumps([
        {"type": "message", "role": "assistant", "content": []},
        {"type": "function_call", "call_id": tool_call_id, "name": "Agent",
         "arguments": json.dumps({"prompt": "Explore the repo", "subagent_type": "Explore", "description": "look"})},
    ])


def tree_rollout(rid: str, tag: str, start: int = 0) -> list[LoggedEvent]:
    """The rollout of the module docstring; call ids begin ``{tag}m1``, ``{tag}s1``, ... (hex)."""
    m1 = root([1, 2, 3], [10, 11], call_id=cid(f"{tag}a1"), output_items_json=agent_call_items("toolu_1"),
              created_at=1.0)
    s1 = root([50, 51], [60, 61, 62], call_id=cid(f"{tag}b1"), created_at=2.0,
              facts={"tools_present": True, "opening_text_digests": [text_digest("Explore the repo")]})
    s2 = child(s1, [70], [71, 72], call_id=cid(f"{tag}b2"), created_at=3.0)
    m2 = child(m1, [80, 81], [90, 91], call_id=cid(f"{tag}a2"), created_at=4.0)
    fork = child(m1, [85], [95, 96], call_id=cid(f"{tag}af"), created_at=4.5)
    summary_ids = list(range(200, 240))
    summary = child(m2, [99], summary_ids, call_id=cid(f"{tag}a3"), created_at=5.0)
    c1 = root([7, 8, *summary_ids[2:38], 9], [300, 301], call_id=cid(f"{tag}c1"), created_at=6.0)
    c2 = child(c1, [400], [401, 402], call_id=cid(f"{tag}c2"), created_at=7.0)
    title = root([500, 501], [502], call_id=cid(f"{tag}d1"), facts={"tools_present": False}, created_at=0.5)
    stray = unresolved([600, 601], [602, 603], call_id=cid(f"{tag}e1"), created_at=8.0)
    bodies = [m1, s1, s2, m2, summary, c1, c2, fork, title, stray, declared(c2)]
    return [LoggedEvent(0, start + i, T0 + (start + i) * 1000, encode_event(event(rid, body)), key_for(rid))
            for i, body in enumerate(bodies)]


def tree_section(text: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("traces: "))
    end = lines.index("", start) if "" in lines[start:] else len(lines)
    return lines[start:end]


def test_explain_prints_each_trace_indented_under_the_trace_that_started_it():
    result = fold_records("r-tree", tree_rollout("r-tree", "1"), TRACES)
    assert [t.kind for t in result.rollout.traces] == ["main", "other", "subagent", "compaction", "other", "side"]
    text = explain(result)
    tree = tree_section(text)
    assert tree[0] == "traces: 6 (main 1, subagent 1, compaction 1, side 1, other 2)"
    assert tree[1] == '  #0 main "main"  by terminal  3 call(s)  44 loss tokens'
    # The fork, the sub-agent and the compaction segment were all started by trace #0: one level in.
    assert tree[2] == '    #1 other "main/fork"  by fork  from call 1a100000  prefix #0[:5]  1 call(s)  2 loss tokens'
    assert tree[3] == ('    #2 subagent "Explore"  by agent_tool  from call 1a100000 tool toolu_1  '
                       '2 call(s)  5 loss tokens')
    assert tree[4] == '    #3 compaction "main" segment 1  by summary  from call 1a300000  2 call(s)  4 loss tokens'
    # Nothing started the stray root (masked, with its reasons) or the side call: top level.
    assert tree[5].startswith('  #4 other "root"  by none  1 call(s)')
    assert tree[5].endswith("MASKED trace_unclassified, unresolved_parent")
    assert tree[6] == '  #5 side "toolless_short"  by side_rule  1 call(s)  not trained'
    assert len(tree) == 7
    # The call tree names the trace each call belongs to.
    assert "[trace #2 subagent]" in text and "[delivered, trace #3 compaction]" in text


def test_a_terminal_record_prints_no_trace_tree():
    result = fold_records("r-tree", tree_rollout("r-tree", "2"), RebuildRules())
    assert result.rollout.traces == []
    text = explain(result)
    assert "traces: " not in text and "trace #" not in text
    assert "delivered chain: " in text


def test_a_traces_rule_file_reports_the_trace_count_and_kinds_change(tmp_path):
    result = fold_records("r-tree", tree_rollout("r-tree", "3"), RebuildRules())
    rules_file = tmp_path / "rules.json"
    rules_file.write_text(json.dumps({"delivery_mode": "traces"}))
    after = rebuild(result.snapshot, RebuildRules.from_mapping(json.loads(rules_file.read_text())))
    changes = trace_changes(result.rollout, after)
    assert changes == ["traces: 0 -> 6 (main 1, subagent 1, compaction 1, side 1, other 2)",
                       "masked traces: 0 -> 1 (other 1)"]
    assert trace_changes(after, result.rollout)[0] == ("traces: 6 (main 1, subagent 1, compaction 1, side 1, "
                                                        "other 2) -> 0")
    assert trace_changes(after, after) == [] and rule_changes(after, after) == []


class FakeLog:
    """An EventLog over records in memory (one partition)."""

    def __init__(self, records: list[LoggedEvent]) -> None:
        self.records = records

    def partitions(self) -> int:
        return 1

    def partition_events(self, partition: int, *, from_time_ms: int | None = None):
        yield from (r for r in self.records if from_time_ms is None or r.timestamp_ms >= from_time_ms)

    def rollout_events(self, rollout_id: str, *, from_offset=None, from_time_ms=None):
        yield from (r for r in self.records if r.key == key_for(rollout_id))

    def close(self) -> None:
        pass


def two_rollouts() -> list[LoggedEvent]:
    first = tree_rollout("r-one", "4")
    return first + tree_rollout("r-two", "5", start=len(first))


def test_summary_counts_traces_and_masked_traces_per_kind_only_when_traces_are_delivered():
    log = FakeLog(two_rollouts())
    data = summarize(log, since_ms=None, until_ms=None,
                     rules=RebuildRules(project_response=False, delivery_mode="traces")).to_dict()
    assert data["rollouts"] == 2
    assert data["traces"] == {
        "traces": 12, "masked": 2, "rollouts_with_masked_traces": 2,
        "by_kind": {"main": {"traces": 2, "masked": 0}, "subagent": {"traces": 2, "masked": 0},
                    "compaction": {"traces": 2, "masked": 0}, "side": {"traces": 2, "masked": 0},
                    "other": {"traces": 4, "masked": 2}},
    }
    text = render_text(data)
    assert "traces (delivery_mode traces): 12, 2 masked (in 2 rollout(s))" in text
    assert any(line.split() == ["other", "4", "traces", "2", "masked"] for line in text.splitlines())
    page = render_html(data)
    HTMLParser().feed(page)
    assert "<h2>Traces (delivery_mode traces)</h2>" in page and "<td>other</td><td>4</td><td>2</td>" in page
    terminal = summarize(log, since_ms=None, until_ms=None).to_dict()
    assert "traces" not in terminal and "Traces" not in render_html(terminal)
    assert "traces (delivery_mode" not in render_text(terminal)


@pytest.fixture
def fake_log(monkeypatch):
    records = two_rollouts()
    monkeypatch.setattr(consumers.replay.eventlog, "EventLog", lambda *a, **k: FakeLog(records))
    # No broker here: the policy-versions topic holds no announcement (else each run waits out the follower).
    monkeypatch.setattr(replay_cli, "read_announcements", lambda bootstrap, topic, required, security=None: [])
    return records


def run_cli(capsys, *argv: str) -> str:
    parser = argparse.ArgumentParser()
    replay_cli.configure(parser)
    assert replay_cli.main(parser.parse_args(["--bootstrap", "x:1", *argv])) == 0
    return capsys.readouterr().out


def test_delivery_flag_makes_the_summary_count_traces(fake_log, capsys, tmp_path):
    data = json.loads(run_cli(capsys, "--summary", "--format", "json", "--delivery", "traces"))
    assert data["traces"]["traces"] == 12 and data["traces"]["by_kind"]["subagent"] == {"traces": 2, "masked": 0}
    assert "traces" not in json.loads(run_cli(capsys, "--summary", "--format", "json"))
    # --delivery overrides the rule file's delivery_mode, both ways.
    rules_file = tmp_path / "rules.json"
    rules_file.write_text(json.dumps({"delivery_mode": "traces"}))
    assert "traces" in json.loads(run_cli(capsys, "--summary", "--format", "json", "--rules", str(rules_file)))
    assert "traces" not in json.loads(run_cli(capsys, "--summary", "--format", "json", "--rules", str(rules_file),
                                              "--delivery", "terminal"))


def test_delivery_flag_explains_a_rollout_with_its_trace_tree(fake_log, capsys):
    text = run_cli(capsys, "--rollout", "r-one", "--delivery", "traces")
    assert tree_section(text)[3] == ('    #2 subagent "Explore"  by agent_tool  from call 4a100000 tool toolu_1  '
                                     '2 call(s)  5 loss tokens')
    assert "traces: " not in run_cli(capsys, "--rollout", "r-one")
    documents = json.loads(run_cli(capsys, "--rollout", "r-one", "--delivery", "traces", "--format", "json"))
    assert [t["kind"] for t in documents[0]["rebuilt"]["traces"]] == ["main", "other", "subagent", "compaction",
                                                                       "other", "side"]


def test_a_traces_rule_file_prints_the_change_and_the_tree_it_would_deliver(fake_log, capsys, tmp_path):
    rules_file = tmp_path / "rules.json"
    rules_file.write_text(json.dumps({"delivery_mode": "traces"}))
    text = run_cli(capsys, "--rollout", "r-two", "--rules", str(rules_file))
    assert "  - traces: 0 -> 6 (main 1, subagent 1, compaction 1, side 1, other 2)" in text
    assert "  - masked traces: 0 -> 1 (other 1)" in text
    assert f"under {rules_file}, traces: 6 (main 1, subagent 1, compaction 1, side 1, other 2)" in text
    assert '    #3 compaction "main" segment 1  by summary  from call 5a300000  2 call(s)  4 loss tokens' in text
    documents = json.loads(run_cli(capsys, "--rollout", "r-two", "--rules", str(rules_file), "--format", "json"))
    assert "traces: 0 -> 6 (main 1, subagent 1, compaction 1, side 1, other 2)" in documents[0]["changes_under_rules"]
    # The same rules with --delivery terminal change nothing.
    text = run_cli(capsys, "--rollout", "r-two", "--rules", str(rules_file), "--delivery", "terminal")
    assert f"under {rules_file} with --delivery terminal: no change" in text


def test_delivery_flag_is_documented_and_checked(capsys):
    parser = argparse.ArgumentParser()
    replay_cli.configure(parser)
    assert "--delivery {terminal,gym,traces}" in parser.format_help()
    assert "--delivery" in replay_cli.__doc__
    with pytest.raises(SystemExit):
        parser.parse_args(["--delivery", "everything"])
    assert "invalid choice: 'everything'" in capsys.readouterr().err
