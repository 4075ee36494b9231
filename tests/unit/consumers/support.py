"""Helpers for the consumer tests: conversations of calls, folded into real snapshots."""

from __future__ import annotations

import dataclasses
import itertools
import json

from processors.replay import replay
from schemas.ids import response_id
from schemas.records import CallCaptured, ParentResolution, Snapshot, SnapshotCall
from tests.factories import event, finished, hashed, make_call

R = "rollout-r"
_fp = itertools.count()


def snapshot_of(*bodies, finish=None, rollout: str = R) -> Snapshot:
    """Fold the bodies (then a finish) the way the processor does; return the last snapshot."""
    events = [event(rollout, body) for body in (*bodies, finish or finished())]
    return [s for step in replay(events) for s in step.snapshots][-1]


def tokens(call: CallCaptured) -> list[int]:
    """Full cumulative ids of a call built with a full prompt."""
    assert not call.prompt_is_delta
    return call.prompt_token_ids + call.generation_token_ids


_AFTER = ("output_items_json", "token_item_index")


def _make(prompt, gen, **kw) -> CallCaptured:
    # tests.factories.make_call fixes the output items; override them afterwards.
    after = {k: kw.pop(k) for k in _AFTER if k in kw}
    kw.setdefault("continuation_fingerprint", hashed(f"fp{next(_fp)}"))
    kw.setdefault("facts", {"tools_present": True})
    call = make_call(list(prompt), list(gen), **kw)
    return dataclasses.replace(call, **after) if after else call


def root(prompt, gen, **kw) -> CallCaptured:
    return _make(prompt, gen, **kw)


def child(parent: CallCaptured, extra, gen, **kw) -> CallCaptured:
    """A call continuing ``parent`` (a RESOLVED claim the processor verifies) with ``extra`` new prompt ids."""
    return _make(tokens(parent) + list(extra), list(gen), parent=parent.model_call_id,
                 parent_digest=parent.digest, request_fingerprint=parent.continuation_fingerprint, **kw)


def unresolved(prompt, gen, **kw) -> CallCaptured:
    return _make(prompt, gen, resolution=ParentResolution.UNRESOLVED,
                 request_fingerprint=kw.pop("request_fingerprint", hashed(f"nomatch{next(_fp)}")), **kw)


def declared(call: CallCaptured, **kw):
    """A finish whose final response id names ``call`` (as the interceptor's ids do)."""
    return finished(final_response_id=response_id("chatcmpl-", call.model_call_id), **kw)


def text_call(call: CallCaptured, text: str) -> CallCaptured:
    items = [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}]
    return dataclasses.replace(call, output_items_json=json.dumps(items))


def detail(rollout) -> dict:
    return json.loads(rollout.metrics.detail_json)


def codes(rollout) -> list[str]:
    return [r.code for r in rollout.mask_reasons]


def reordered(snapshot: Snapshot, order: list[int]) -> Snapshot:
    """The same snapshot with its calls listed (and sequenced) in another order."""
    calls = [snapshot.calls[i] for i in order]
    return dataclasses.replace(snapshot, calls=[SnapshotCall(seq=n, call=sc.call, late=sc.late,
                                                             lineage_note=sc.lineage_note)
                                                for n, sc in enumerate(calls)])
