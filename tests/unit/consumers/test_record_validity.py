"""A record's content can never stop a sink or make it write non-JSON (hostile-probe regressions).

- a RolloutFinished whose result is not JSON used to stop the JSONL sink (``json.loads`` raised, the
  consumer exited 3, and again on every restart): it is now delivered masked (``invalid_result``),
  its raw text kept as a string, and the consumer goes on;
- non-finite numbers (a NaN reward, ``1e999``, NaN log-probs from a Gym entry, NaN in output items or
  routed experts, NaN metrics) used to be written as ``NaN`` / ``Infinity``: each is masked with a
  reason and the output is strict JSON;
- every built-in sink (JSONL, Kafka, in-process) and renderer applies the same check.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consumers.gym.adapters import entry_to_call
from consumers.rebuild import rebuild, to_json_dict, to_json_line
from consumers.rebuild.validity import _holds_word, checked_record, strict_loads
from consumers.sinks.conformance import sample_rollout
from consumers.sinks.kafka import KafkaSink
from consumers.sinks.plugin import JsonlSink
from consumers.sinks.stream import RolloutStream
from schemas.codec import decode_rebuilt
from schemas.records import RolloutFinished
from tests.unit.consumers.fakes import Journal, RecordingSink
from tests.unit.consumers.support import child, codes, root, snapshot_of
from tests.unit.consumers.test_loop import clean, consumer_for

NOT_JSON = '{"reward": 1.0, oops'


def strict(line: bytes | str):
    """Parse as RFC 8259 JSON: NaN, Infinity and overflowing numbers are refused."""
    def refuse(name):
        raise AssertionError(f"non-JSON constant {name} written")

    def finite(text):
        value = float(text)
        assert math.isfinite(value), f"number {text} overflows"
        return value

    if isinstance(line, bytes):
        line = line.decode("utf-8")  # strict UTF-8 too
    return json.loads(line, parse_constant=refuse, parse_float=finite)


def finished_with(result_json: str, **kw) -> RolloutFinished:
    return RolloutFinished(result_json=result_json, **kw)


def good_chain():
    r = root([1, 2], [3])
    return r, child(r, [4], [5])


def reason(rollout, code):
    found = [r for r in rollout.mask_reasons if r.code == code]
    assert found, f"no {code} reason in {codes(rollout)}"
    return found[0]


# -- 1. a result that is not JSON ---------------------------------------------------------------

def test_a_result_that_is_not_json_is_delivered_masked_with_its_raw_text_kept():
    out = rebuild(snapshot_of(*good_chain(), finish=finished_with(NOT_JSON)))
    assert out.mask_sample and codes(out) == ["invalid_result"]
    detail = reason(out, "invalid_result").detail
    assert "result_json" in detail and "not valid JSON" in detail and "line 1 column" in detail  # the parse error
    assert "oops" in detail and "finish" in detail  # the value, and the fix
    assert out.trajectory is not None  # the tokens are still there for diagnosis; the mask says why
    record = strict(to_json_line(out))
    assert record["result"] == NOT_JSON and record["mask_sample"] is True
    assert to_json_dict(out)["result"] == NOT_JSON


@pytest.mark.parametrize("raw", ["", "not json", "{", "[1,", "\x00", '"unterminated', "{}{}"])
def test_no_invalid_result_text_can_make_rendering_raise(raw):
    out = rebuild(snapshot_of(*good_chain(), finish=finished_with(raw)))
    assert codes(out) == ["invalid_result"]
    assert strict(to_json_line(out))["result"] == raw


async def test_the_jsonl_sink_writes_a_record_with_an_invalid_result_instead_of_raising(tmp_path):
    # A record built without rebuild (a custom pipeline) is checked by the sink itself.
    bad = dataclasses.replace(sample_rollout("bad"), result_json=NOT_JSON)
    sink = JsonlSink(str(tmp_path / "out.jsonl"))
    await sink.deliver(bad)
    await sink.deliver(sample_rollout("next"))
    await sink.close()
    lines = [strict(line) for line in (tmp_path / "out.jsonl").read_bytes().splitlines()]
    assert [r["rollout_id"] for r in lines] == ["bad", "next"]
    assert lines[0]["mask_sample"] is True and lines[0]["result"] == NOT_JSON
    assert [r["code"] for r in lines[0]["mask_reasons"]] == ["invalid_result"]
    assert lines[1]["mask_sample"] is False
    again = JsonlSink(str(tmp_path / "out.jsonl"))  # restart: the identities are read back, no duplicate
    await again.deliver(bad)
    await again.close()
    assert len((tmp_path / "out.jsonl").read_bytes().splitlines()) == 2


async def test_the_consumer_goes_on_past_a_rollout_whose_result_is_not_json(tmp_path):
    path = tmp_path / "out.jsonl"
    broken = snapshot_of(*good_chain(), rollout="r-broken", finish=finished_with(NOT_JSON))
    sink = JsonlSink(str(path))
    consumer, kafka, producer, _ = consumer_for(sink, [clean("r-1"), broken, clean("r-3")])
    stats = await consumer.run(max_rollouts=3)
    await sink.close()
    assert (stats.delivered, stats.masked, dict(stats.mask_reasons)) == (3, 1, {"invalid_result": 1})
    assert kafka.committed == {("tokentrail.snapshots", 0): 3}  # every partition offset moves on
    assert sum(topic.endswith("rollout-events") for topic, *_ in producer.produced) == 3  # all retired
    records = [strict(line) for line in path.read_bytes().splitlines()]
    assert [(r["rollout_id"], r["mask_sample"]) for r in records] == [
        ("r-1", False), ("r-broken", True), ("r-3", False)]
    assert records[1]["result"] == NOT_JSON


# -- 2. non-finite numbers ----------------------------------------------------------------------

@pytest.mark.parametrize("result_json, quoted", [
    ('{"reward": NaN}', "NaN"), ('{"reward": -Infinity}', "-Infinity"), ('{"reward": Infinity}', "Infinity"),
    ('{"reward": 1e999}', "1e999"), ('[1.5, NaN]', "NaN"),
])
def test_a_non_finite_number_in_the_result_masks_and_is_never_written(result_json, quoted):
    out = rebuild(snapshot_of(*good_chain(), finish=finished_with(result_json)))
    assert codes(out) == ["invalid_result"]
    assert quoted in reason(out, "invalid_result").detail
    line = to_json_line(out)
    assert strict(line)["result"] == result_json  # kept, as a string


def test_a_nan_log_prob_from_a_gym_entry_masks_and_withholds_the_trajectory():
    # The interceptor refuses such log-probs at capture; a Gym TokenSink entry (or a direct event) does not.
    entry = {"schema_version": 5, "model_call_id": "c" * 32, "prompt_token_ids": [1, 2], "generation_token_ids": [3, 4],
             "generation_log_probs": [-0.5, float("nan")], "parent_resolution": "root", "output_items": []}
    call = entry_to_call(entry)
    out = rebuild(snapshot_of(call))
    assert out.mask_sample and codes(out) == ["non_finite_log_prob"]
    r = reason(out, "non_finite_log_prob")
    assert "generation_log_probs[1] = nan" in r.detail and r.call_ids == ["c" * 32]
    assert out.trajectory is None and out.response_json is None
    strict(to_json_line(out))


@pytest.mark.parametrize("bad", [float("inf"), float("-inf")])
def test_an_infinite_log_prob_masks(bad):
    out = rebuild(snapshot_of(root([1, 2], [3, 4], log_probs=[bad, -0.1])))
    assert codes(out) == ["non_finite_log_prob"]
    strict(to_json_line(out))


def test_nan_in_captured_output_items_masks_and_the_projection_is_never_non_json():
    r = root([1, 2], [3], output_items_json='[{"type": "message", "role": "assistant", "content": [], "score": NaN}]')
    out = rebuild(snapshot_of(r))
    assert codes(out) == ["non_finite_value"]
    detail = reason(out, "non_finite_value").detail
    assert "output_items_json" in detail and "NaN" in detail
    strict(to_json_line(out))


def test_nan_in_routed_experts_masks():
    out = rebuild(snapshot_of(root([1, 2], [3], routed_experts_json="[[1, NaN]]")))
    assert codes(out) == ["non_finite_value"] and "routed_experts_json" in out.mask_reasons[0].detail
    strict(to_json_line(out))


def test_a_foreign_record_with_non_finite_numbers_is_masked_by_the_renderer():
    base = sample_rollout("foreign")
    traj = dataclasses.replace(base.trajectory, log_probs=[float("nan")] + base.trajectory.log_probs[1:])
    metrics = dataclasses.replace(base.metrics, delivered_fraction=float("inf"), detail_json="[1, 2]")
    bad = dataclasses.replace(base, trajectory=traj, metrics=metrics,
                              response_json='{"id": "x", "output": [{"generation_log_probs": [NaN]}]}')
    record = strict(to_json_line(bad))
    assert record["mask_sample"] is True and record["trajectory"] is None and record["response"] is None
    assert [r["code"] for r in record["mask_reasons"]] == ["non_finite_log_prob", "non_finite_value", "invalid_record"]
    assert record["_ng_token_capture"]["delivered_fraction"] == 0.0
    assert record["_ng_token_capture"]["invalid_detail_json"] == "[1, 2]"


@pytest.mark.parametrize("tail", ["NaN", "-Infinity", "Infinity"])
def test_a_non_finite_word_after_near_misses_is_still_found(tail):
    # The scan hops from one first letter to the next: decoys before the real word must not hide it.
    text = '{"id": "N I Na Inf NNa IInfinit", "output": [{"generation_log_probs": [' + tail + "]}]}"
    bad = dataclasses.replace(sample_rollout("foreign"), response_json=text)
    record = strict(to_json_line(bad))
    assert record["response"] is None and "non_finite_value" in [r["code"] for r in record["mask_reasons"]]


@given(st.text(alphabet="NaIfinty0,", max_size=40))
def test_the_word_scan_agrees_with_substring_search(text):
    assert _holds_word(text, "NaN") == ("NaN" in text)
    assert _holds_word(text, "Infinity") == ("Infinity" in text)


def test_a_projection_that_is_not_json_is_withheld():
    bad = dataclasses.replace(sample_rollout("foreign"), response_json='{"id": "x", "output": [NaN')
    record = strict(to_json_line(bad))
    assert record["response"] is None and record["mask_sample"] is True


def test_a_lone_surrogate_is_written_as_valid_utf8_json():
    # Issue 26: a lone surrogate is no text; it was delivered unmasked. Now masked, the raw text kept readable.
    bad = dataclasses.replace(sample_rollout("s"), result_json=json.dumps({"text": "\ud800"}, ensure_ascii=False))
    record = strict(to_json_line(bad))
    assert record["mask_sample"] is True and record["result"] == '{"text": "\\ud800"}'
    assert "invalid_result" in [r["code"] for r in record["mask_reasons"]]


@pytest.mark.parametrize("result_json", ['{"text": "\\ud800"}',  # escaped in the JSON text (a raw one: above) '"\\udfff"',  # escaped in the JSON text
                                         '["ok", "\\ud83d"]'])
def test_a_direct_producers_lone_surrogate_result_is_masked_and_stays_masked(result_json):
    out = rebuild(snapshot_of(*good_chain(), finish=finished_with(result_json)))
    assert out.mask_sample and codes(out) == ["invalid_result"]
    assert "lone surrogate" in reason(out, "invalid_result").detail
    again = checked_record(out)  # a sink checks again: no second reason, no double wrapping
    assert again is out
    line = to_json_line(out)
    line.decode("utf-8")  # valid UTF-8
    assert strict(line)["mask_sample"] is True


def test_a_paired_surrogate_escape_is_text():
    out = rebuild(snapshot_of(*good_chain(), finish=finished_with('{"emoji": "\\ud83d\\ude00"}')))
    assert not out.mask_sample, codes(out)


@pytest.mark.parametrize("created_at", [math.nan, math.inf, -math.inf])
def test_a_direct_producers_non_finite_created_at_is_masked(created_at):
    r, c = good_chain()
    out = rebuild(snapshot_of(r, dataclasses.replace(c, created_at=created_at)))
    assert out.mask_sample and "invalid_record" in codes(out)
    found = reason(out, "invalid_record")
    assert c.model_call_id in found.call_ids and "created_at" in found.detail


@pytest.mark.parametrize("index", [2**31 - 1, 7, -1])
def test_a_direct_producers_out_of_range_token_item_index_is_masked(index):
    r, c = good_chain()
    out = rebuild(snapshot_of(r, dataclasses.replace(c, token_item_index=index)))
    assert out.mask_sample, codes(out)
    assert any(f"token_item_index={index}" in m.detail for m in out.mask_reasons), out.mask_reasons


def test_a_valid_record_is_unchanged_and_rendered_byte_for_byte_as_before():
    out = rebuild(snapshot_of(*good_chain()))
    assert checked_record(out) is out and not out.mask_sample
    # A string that merely contains the words NaN / Infinity is fine.
    named = dataclasses.replace(out, result_json='{"note": "NaN and Infinity are words"}')
    assert checked_record(named) is named


def test_strict_loads_names_the_problem():
    for text, words in (("NaN", "NaN"), ("1e999", "overflows"), ("{", "line 1 column 2")):
        with pytest.raises(ValueError, match=words):
            strict_loads(text)


# -- every sink ---------------------------------------------------------------------------------

async def test_the_kafka_sink_encodes_an_invalid_result_masked():
    sink = KafkaSink("127.0.0.1:9")  # nothing is produced: only the encoding is exercised
    try:
        data = sink._encode(dataclasses.replace(sample_rollout("bad"), result_json='{"reward": NaN}'))
    finally:
        await sink.close()
    decoded = decode_rebuilt(data)
    assert decoded.mask_sample and [r.code for r in decoded.mask_reasons] == ["invalid_result"]
    assert json.loads(decoded.result_json) == '{"reward": NaN}'


async def test_the_kafka_sink_sends_a_too_large_record_masked_instead_of_stopping_the_consumer():
    sink = KafkaSink("127.0.0.1:9", max_message_bytes=64 * 1024 + 4096)
    try:
        big = sample_rollout("big", tokens=20_000)
        decoded = decode_rebuilt(sink._encode(big))
        huge_result = dataclasses.replace(sample_rollout("huge"), result_json=json.dumps({"x": "y" * 10_000}))
        shrunk_result = decode_rebuilt(sink._encode(huge_result))
    finally:
        await sink.close()
    assert decoded.mask_sample and decoded.trajectory is None
    (r,) = decoded.mask_reasons
    assert r.code == "record_too_large" and "max.message.bytes" in r.detail and "replay" in r.detail
    assert decoded.result_json == big.result_json  # the result still fits, so it is kept
    assert shrunk_result.mask_sample and "withheld" in json.loads(shrunk_result.result_json)
    assert sink.records_shrunk == 2


async def test_the_in_process_stream_hands_the_trainer_the_checked_record():
    stream = RolloutStream()
    delivery = asyncio.create_task(stream.deliver(dataclasses.replace(sample_rollout("bad"), result_json=NOT_JSON)))
    got = await asyncio.wait_for(stream.__anext__(), 1)
    assert got.mask_sample and [r.code for r in got.mask_reasons] == ["invalid_result"]
    assert json.loads(got.result_json) == NOT_JSON
    stream.ack()
    await asyncio.wait_for(delivery, 1)


async def test_a_raising_group_key_masks_that_rollout_alone():
    def key(rollout):
        return json.loads(rollout.result_json)["group"]  # KeyError for a result without a group

    stream = RolloutStream(group_key=key, group_size=2)
    delivery = asyncio.create_task(stream.deliver(sample_rollout("lonely")))
    (got,) = await asyncio.wait_for(stream.__anext__(), 1)
    assert got.mask_sample and got.mask_reasons[-1].code == "invalid_group" and "group" in got.mask_reasons[-1].detail
    stream.ack()
    await asyncio.wait_for(delivery, 1)


async def test_an_unhashable_group_key_masks_that_rollout_alone():
    stream = RolloutStream(group_key=lambda r: ["not", "hashable"], group_size=2)
    delivery = asyncio.create_task(stream.deliver(sample_rollout("a")))
    (got,) = await asyncio.wait_for(stream.__anext__(), 1)
    assert got.mask_reasons[-1].code == "invalid_group"
    stream.ack()
    await asyncio.wait_for(delivery, 1)


async def test_a_recording_sink_behind_the_consumer_sees_the_masked_record():
    journal = Journal()
    sink = RecordingSink(journal)
    broken = snapshot_of(*good_chain(), rollout="r-nan", finish=finished_with('{"reward": NaN}'))
    consumer, *_ = consumer_for(sink, [broken, clean("r-2")], journal)
    await consumer.run(max_rollouts=2)
    assert [(r.rollout_id, r.mask_sample) for r in sink.delivered] == [("r-nan", True), ("r-2", False)]
    assert json.loads(sink.delivered[0].result_json) == '{"reward": NaN}'
