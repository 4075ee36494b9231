"""Cost shapes of the rebuild and the consumer, pinned by counting (never by timing).

Each test counts work a design choice removed and fails if it comes back:
Python running per token, tokens compared between calls that are not siblings,
the rebuild re-checking its own projection, a token chunk formatted per carrier
instead of once, the record's arrays rendered twice or as one Python int per
mask byte, the projection copied more than twice into the JSONL line, the chain
digest packing the whole chain into one array beside the trajectory's list, the
unknown-version check slicing the loss mask per call when no span is unknown,
traces mode allocating a trace's spans after other traces' token lists, and more than one decode, rebuild, render, retire and ack per rollout in the consumer.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import struct
import sys
import tracemalloc

import pytest

import consumers.loop as loop_module
import consumers.sinks.plugin as plugin_module
from consumers.loop import RebuildConsumer
from consumers.rebuild import RebuildRules, rebuild, to_json_line
from consumers.rebuild import projection as projection_module
from consumers.rebuild import staleness as staleness_module
from consumers.rebuild import traces as traces_module
from consumers.rebuild import trajectory as trajectory_module
from consumers.rebuild import validity as validity_module
from consumers.rebuild.graph import build_forest, resolve_retries, retry_groups
from consumers.settings import ConsumerSettings
from consumers.sinks.plugin import JsonlSink
from schemas.hashing import compute_digest
from tests.unit.consumers.fakes import FakeConsumer, FakeProducer, Journal, messages_for
from tests.unit.consumers.support import child, root, snapshot_of

CALLS = 30


def chain(per_call: int, calls: int = CALLS, rollout: str = "r-costs"):
    """``calls`` chained calls, each adding ``per_call`` prompt tokens and generating ``per_call``."""
    made, parent = [], None
    for i in range(calls):
        base = i * 2 * per_call
        prompt = [(7 * (base + k)) % 50_000 for k in range(per_call)]
        generation = [(11 * (base + per_call + k)) % 50_000 + 1 for k in range(per_call)]
        parent = root(prompt, generation) if parent is None else child(parent, prompt, generation)
        made.append(parent)
    return snapshot_of(*made, rollout=rollout)


@pytest.fixture(scope="module")
def short():
    return chain(8)


@pytest.fixture(scope="module")
def long():
    return chain(80)


def python_steps(fn) -> int:
    """Python function calls and lines run by ``fn()`` (C-level loops are invisible to it).

    Garbage collection is off while counting: a collection in the middle runs whatever
    finalizers earlier tests left behind (CI once counted 13 of their lines), which is
    not the rebuild's work.
    """
    fn()  # first-use caches (encoders, compiled formats) are not per-call work
    gc.collect()
    steps = 0

    def tracer(frame, event, arg):
        nonlocal steps
        steps += 1
        return tracer

    previous, collecting = sys.gettrace(), gc.isenabled()
    gc.disable()
    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(previous)
        if collecting:
            gc.enable()
    return steps


@pytest.mark.parametrize("rules", [RebuildRules(project_response=False), RebuildRules(),
                                   RebuildRules(delivery_mode="traces")], ids=["compact", "projection", "traces"])
def test_python_runs_per_call_never_per_token(short, long, rules):
    # Ten times the tokens over the same calls: not one more Python line or call.
    steps = [python_steps(lambda s=s: to_json_line(rebuild(s, rules))) for s in (short, long)]
    assert steps[0] == steps[1]


class CountingList(list):
    """A list that counts how often something walks it (``tuple()``, ``==`` by iteration, ``for``)."""

    walks = 0

    def __iter__(self):
        CountingList.walks += 1
        return super().__iter__()


def test_retry_grouping_compares_tokens_only_between_siblings_of_one_length():
    forest = build_forest(chain(40, calls=12).calls, {})
    for node in forest.live:
        node.delta = CountingList(node.delta)
    CountingList.walks = 0
    assert resolve_retries(forest, set()) == [] and CountingList.walks == 0  # a chain: nothing compared
    # Two retries of one call (same parent, same new tokens) are still found, by their tokens.
    a, b = root([1, 2], [3]), root([1, 2], [4])
    retried = build_forest(snapshot_of(a, b).calls, {})
    for node in retried.live:
        node.delta = CountingList(node.delta)
    assert [len(g) for g in retry_groups(retried.live)] == [2] and CountingList.walks == 2


def test_the_rebuild_checks_each_log_prob_once_and_never_scans_its_own_projection(long, monkeypatch):
    checked, scans = [], []
    real_check, real_scan = validity_module.first_non_finite, validity_module._holds_word
    monkeypatch.setattr(trajectory_module, "first_non_finite", lambda v: checked.append(len(v)) or real_check(v))
    monkeypatch.setattr(validity_module, "first_non_finite", lambda v: checked.append(len(v)) or real_check(v))
    monkeypatch.setattr(validity_module, "_holds_word", lambda t, w: scans.append(len(t)) or real_scan(t, w))
    out = rebuild(long)
    generated = len(out.trajectory.log_probs)
    assert not out.mask_sample and sum(checked) == generated and scans == []
    to_json_line(out)  # a sink checks what it is handed, whoever built it: one scan per word
    assert scans == [len(out.response_json)] * 2


def test_the_projection_formats_each_token_once(long, monkeypatch):
    ids, log_probs = [], []
    real_ids, real_log_probs = projection_module._ids, projection_module._log_probs_text
    monkeypatch.setattr(projection_module, "_ids", lambda v: ids.append(len(v)) or real_ids(v))
    monkeypatch.setattr(projection_module, "_log_probs_text", lambda v: log_probs.append(len(v)) or real_log_probs(v))
    out = rebuild(long)
    # Every carrier repeats the running prompt (calls x tokens of text); each id was formatted once.
    assert sum(ids) == len(out.trajectory.token_ids) and sum(log_probs) == len(out.trajectory.log_probs)
    assert out.response_json.count('"prompt_token_ids":[') == CALLS


def encoded_list_items(value) -> int:
    if isinstance(value, dict):
        return sum(encoded_list_items(v) for v in value.values())
    if isinstance(value, list):
        return len(value) + sum(encoded_list_items(v) for v in value)
    return 0


def test_the_json_line_encodes_each_per_token_array_once_and_the_mask_without_ints(long, monkeypatch):
    out = rebuild(long)
    items = []
    real = __import__("json").JSONEncoder.iterencode

    def spy(self, o, _one_shot=False):
        items.append(encoded_list_items(o))
        return real(self, o, _one_shot)

    monkeypatch.setattr(__import__("json").JSONEncoder, "iterencode", spy)
    to_json_line(out)
    per_token = len(out.trajectory.token_ids) + len(out.trajectory.log_probs)
    # The ids and log-probs once each, plus the small parts (call ids of the spans and the metrics' lists):
    # never the mask as a list of ints, never an array twice.
    assert per_token <= sum(items) < per_token + 10 * CALLS


def test_the_json_line_copies_the_projection_at_most_twice():
    out = rebuild(chain(60, calls=60))
    size = len(out.response_json)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        line = to_json_line(out)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    # The joined text and its UTF-8 bytes, each the line's size, and the small fragments: no third copy.
    assert size > 0.9 * len(line) and peak < 2.2 * len(line)


def test_the_chain_digest_is_the_schemas_digest():
    # One home for the digest (its golden vectors: tests/unit/schemas/test_hashing_golden.py).
    assert trajectory_module.compute_digest is compute_digest


def test_the_chain_digest_never_packs_the_whole_chain_at_once():
    # A whole-chain packed array (8 bytes an id) beside the trajectory's own list doubled the heap a rebuild
    # spans, and glibc trimmed and re-faulted it on every rebuild (docs/perf/consumer.md): the digest packs a
    # bounded chunk at a time. The bytes hashed are the same: a digest over several chunks equals one made of
    # the whole packed sequence.
    ids = [(7 * k) % 50_000 for k in range(100_000)]
    whole = hashlib.sha256(b"nemo-gym-tokens" + struct.pack(">BQ", 1, len(ids)) + struct.pack(f">{len(ids)}Q", *ids))
    assert compute_digest(ids) == whole.hexdigest()
    tracemalloc.start()
    try:
        compute_digest(ids)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * len(ids) // 4  # the whole packed chain would be 800 KB


def test_the_unknown_version_check_slices_no_mask_when_no_span_is_unknown(long, monkeypatch):
    seen = []
    real = staleness_module._loss_bearing_spans_of
    monkeypatch.setattr(staleness_module, "_loss_bearing_spans_of", lambda ts: seen.append(list(ts)) or real(seen[-1]))
    out = rebuild(long)
    # One pass over the spans' versions; the mask is sliced only for a trajectory that holds an unknown span.
    assert not out.mask_sample and seen == [[]]


def test_traces_mode_builds_every_traces_spans_before_any_token_list(monkeypatch):
    # A trace's spans allocate per call; after another trace's token lists exist, that started a garbage
    # collection walking them (0.6 ms of a 128k-token tree): spans first, then the per-token arrays.
    from compose.tools.bench._rebuild_tree import synth_tree_snapshot

    order = []
    real_spans, real_tokens = traces_module.chain_spans, traces_module.chain_tokens
    monkeypatch.setattr(traces_module, "chain_spans", lambda path: order.append("spans") or real_spans(path))
    monkeypatch.setattr(traces_module, "chain_tokens", lambda path, s: order.append("tokens") or real_tokens(path, s))
    out = rebuild(synth_tree_snapshot(40, 4096), RebuildRules(delivery_mode="traces", project_response=False))
    assert not out.mask_sample and len(out.traces) > 2
    assert order.count("tokens") == len(out.traces) - 1  # the delivered chain's trajectory is reused, not rebuilt
    assert order == ["spans"] * order.count("tokens") + ["tokens"] * order.count("tokens")


def test_the_consumer_decodes_rebuilds_renders_retires_and_acks_once_per_rollout(tmp_path, monkeypatch):
    counts = {"decode": 0, "rebuild": 0, "render": 0, "scan": 0}

    def counting(name, fn):
        def spy(*args, **kwargs):
            counts[name] += 1
            return fn(*args, **kwargs)
        return spy

    monkeypatch.setattr(loop_module, "decode_snapshot", counting("decode", loop_module.decode_snapshot))
    monkeypatch.setattr(loop_module, "rebuild", counting("rebuild", loop_module.rebuild))
    monkeypatch.setattr(plugin_module, "to_json_line", counting("render", plugin_module.to_json_line))
    monkeypatch.setattr(validity_module, "_holds_word", counting("scan", validity_module._holds_word))
    snaps = [chain(8, calls=6, rollout=f"r-{i}") for i in range(3)]
    journal = Journal()
    producer = FakeProducer(journal)
    flushes = []
    real_flush = producer.flush
    producer.flush = lambda timeout=0: flushes.append(1) or real_flush(timeout)
    kafka = FakeConsumer(journal, messages_for(snaps))
    sink = JsonlSink(str(tmp_path / "out.jsonl"))
    settings = ConsumerSettings(bootstrap="127.0.0.1:9", poll_timeout_s=0.01)
    consumer = RebuildConsumer(settings, sink, kafka_consumer=kafka, kafka_producer=producer)
    stats = asyncio.run(consumer.run(max_rollouts=3))
    assert stats.delivered == 3 and not stats.masked
    # One projection scan per word and rollout: the sink's; the rebuild does not re-check its own text.
    assert counts == {"decode": 3, "rebuild": 3, "render": 3, "scan": 2 * 3}
    assert len(producer.produced) == 3 and len(flushes) == 3  # one retire per rollout, one ack awaited each
    assert journal.kinds().count("commit") == 3
