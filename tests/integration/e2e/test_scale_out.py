"""Scale-out on one machine, real processes on the real broker: more partitions, workers and groups change no record.

The same deterministic workload (multi-call, tool-using rollouts of the OpenAI SDK harness on the
reference engine) runs twice, on topics of its own each time:

- one worker: 1 interceptor, 1 fold worker, 1 consumer, the default 4 partitions;
- scaled: 12 partitions, 2 interceptors (rollouts split between them), 3 fold workers in one app
  id, a consumer group of 3 and an independent group of 1, and, while rollouts are in flight, a
  fold worker killed with -9 and a new one started, a consumer added to the group, one stopped
  (SIGTERM) and one killed with -9 and replaced.

Delivered means written by a consumer's JSONL sink. "Once per group" is one distinct record per
rollout per group: at-least-once delivery may write a rollout again after a rebalance, and such a
repeat must be the same bytes (``compose.rig.scaleout_checks``). The per-worker figures are printed
(``pytest -s``); ``tokentrail bench scaleout`` runs the same topology with larger numbers.
"""

from __future__ import annotations

import asyncio

import pytest

from compose.rig.scaleout import ONE_WORKER, SCALED, Chaos, ScaleRun, Workload, print_figures
from compose.rig.scaleout_checks import canonical, check, group_deliveries, one_record_each, replayed

pytestmark = [pytest.mark.integration, pytest.mark.real_broker]

WORK = Workload(rollouts=24, concurrency=8)


def _run(bootstrap, run_dir, topology, name, chaos):
    run = ScaleRun(bootstrap, run_dir, topology, name=name)
    try:
        run.start()
        outcomes = asyncio.run(run.drive(WORK, chaos))
        run.wait_delivered(WORK.rollout_ids())
        run.settle()
        run.stop()
    finally:
        run.stack.stop()
    return run, outcomes


@pytest.fixture(scope="module")
def runs(kafka_bootstrap, tmp_path_factory):
    one, one_out = _run(kafka_bootstrap, tmp_path_factory.mktemp("one"), ONE_WORKER, "so1w", Chaos.none())
    scaled, scaled_out = _run(kafka_bootstrap, tmp_path_factory.mktemp("scaled"), SCALED, "soN", Chaos())
    print()
    print_figures("one worker", one)
    print_figures("scaled", scaled)
    return one, one_out, scaled, scaled_out


def test_every_rollout_ran_to_its_final_answer_through_both_interceptors(runs):
    one, one_out, scaled, scaled_out = runs
    for outcomes in (one_out, scaled_out):
        assert sorted(outcomes) == WORK.rollout_ids()
        assert [o.error for o in outcomes.values() if o.error] == []
        assert [o.calls for o in outcomes.values()] == [WORK.tool_calls(i) + 1 for i in range(WORK.rollouts)]
    captured = scaled.figures()["interceptor calls captured"]
    assert sorted(captured) == ["interceptor", "interceptor-2"]
    assert sum(captured.values()) == sum(o.calls for o in scaled_out.values())
    assert min(captured.values()) > 0, "rollouts were split between the interceptors"


def test_the_faults_happened_while_rollouts_were_in_flight(runs):
    _, _, scaled, _ = runs
    steps = scaled.happened
    assert any("kill -9 processor-2 (exit -9), started processor-4" in s for s in steps), steps
    assert any("added consumer-a4" in s for s in steps), steps
    assert any("stopped consumer-a1 (SIGTERM, exit 0)" in s for s in steps), steps
    assert any("kill -9 consumer-a2 (exit -9), added consumer-a5" in s for s in steps), steps
    finished_at = [int(s.split("after ")[1].split()[0]) for s in steps if "after " in s]
    assert len(finished_at) == 4 and max(finished_at) < WORK.rollouts, "every fault came before the last finish"
    # after the faults, the three running fold workers (the new one among them) and the three running
    # consumers of the group hold four partitions each (`settle` waited for it)
    assert [len(p) for p in scaled.assignments[scaled.app_id]] == [4, 4, 4]
    assert [len(p) for p in scaled.assignments[scaled.first_group]] == [4, 4, 4]


def test_each_group_delivers_each_rollout_once_and_any_repeat_is_the_same_bytes(runs):
    one, _, scaled, _ = runs
    for run in (one, scaled):
        groups = group_deliveries(run)
        assert len(groups) == run.topology.groups
        for g in groups.values():
            assert sorted(g.records) == WORK.rollout_ids(), g.group
            assert all(len(g.distinct(rid)) == 1 for rid in g.records), g.group
    independent = list(group_deliveries(scaled).values())[1]
    # One member, never rebalanced: its sink is idempotent by snapshot identity even if a fold worker
    # re-emitted a snapshot after the kill, so it wrote each rollout exactly once.
    assert independent.repeats == 0
    assert [len(lines) for lines in independent.records.values()] == [1] * WORK.rollouts


def test_both_groups_deliver_the_same_records_and_they_are_what_an_offline_replay_rebuilds(runs):
    _, _, scaled, _ = runs
    first, second = group_deliveries(scaled).values()
    offline = replayed(scaled)
    for rid in WORK.rollout_ids():
        (record,) = first.distinct(rid)
        assert second.distinct(rid) == {record}, rid
        assert offline[rid] == [record], f"{rid}: the live record differs from the replay of the event log"


def test_scaled_records_are_the_one_worker_records_byte_for_byte_but_for_call_ids(runs):
    one, _, scaled, _ = runs
    reference = one_record_each(one)
    scaled_records = one_record_each(scaled)
    for rid in WORK.rollout_ids():
        assert canonical(scaled_records[rid]) == canonical(reference[rid]), rid
        assert b'"mask_sample":false' in reference[rid], f"{rid} is a clean rollout in the reference run"
    # the same verdict the benchmark prints
    verdict = check(scaled, WORK.rollout_ids(), reference)
    assert verdict.ok, verdict.problems
