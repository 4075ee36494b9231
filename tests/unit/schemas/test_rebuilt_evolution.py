"""``RebuiltRollout.traces`` (issue 12) and the three trace facts of ``CallFacts`` evolve the contract
compatibly: a trainer still reading with the writer schema from before them reads a traces record
(the top-level trajectory intact, the traces skipped), and a record from that older writer decodes
with ``traces == []``."""

from __future__ import annotations

import io
import json
from importlib import resources

import fastavro

from consumers.rebuild import RebuildRules, rebuild
from schemas import codec
from tests.unit.consumers.support import child, declared, root, snapshot_of


def _writer_without_traces() -> dict:
    history = resources.files("schemas") / "avro" / "history"
    older = [json.loads(f.read_text()) for f in sorted(history.iterdir(), key=lambda f: f.name)
             if f.name.startswith("RebuiltRollout.") and '"traces"' not in f.read_text()]
    assert older, "the released RebuiltRollout writer without traces must stay archived"
    return older[-1]


def _forked_rollout():
    m1 = root([1, 2, 3], [10, 11])
    m2 = child(m1, [4], [12, 13])
    fork = child(m1, [5], [14])
    out = rebuild(snapshot_of(m1, m2, fork, finish=declared(m2)), RebuildRules(delivery_mode="traces"))
    assert len(out.traces) == 2 and not out.mask_sample
    return out


def test_a_reader_from_before_traces_reads_a_traces_record():
    rollout = _forked_rollout()
    data = codec.encode_rebuilt(rollout)
    body = data[len(codec.MAGIC) + 8:]  # magic, 8-byte fingerprint, then the Avro body
    new, old = (fastavro.parse_schema(s) for s in (codec.rebuilt_codec().schema, _writer_without_traces()))
    datum = fastavro.schemaless_reader(io.BytesIO(body), new, old)
    assert "traces" not in datum
    assert datum["rollout_id"] == rollout.rollout_id and datum["mask_sample"] is False
    assert datum["trajectory"]["token_ids"] == codec.to_avro(rollout)["trajectory"]["token_ids"]


def test_a_record_from_the_writer_before_traces_decodes_with_no_traces():
    rollout = _forked_rollout()
    old = fastavro.parse_schema(_writer_without_traces())
    datum = {k: v for k, v in codec.to_avro(rollout).items() if k != "traces"}
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, old, datum)
    back = codec.decode_rebuilt(codec.MAGIC + codec._fingerprint_of(old) + buf.getvalue())
    assert back.traces == [] and back.trajectory == rollout.trajectory and back.metrics == rollout.metrics
