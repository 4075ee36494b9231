"""The shared lineage rules: request-time parent selection, delta and prefix verification."""

from __future__ import annotations

import dataclasses

from schemas.hashing import compute_digest, conversation_prefix_digests
from schemas.lineage_rules import (
    AMBIGUOUS,
    INDEX_COLD,
    NO_MATCH,
    PublishedCandidate,
    delta_link_holds,
    delta_parent_len,
    prefix_verified,
    published_candidates,
    select_parent,
)
from schemas.records import ParentResolution
from tests.factories import make_call

ITEMS = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


@dataclasses.dataclass
class Cand:
    call_id: str
    cum_len: int
    digest: str
    context_len: int
    context_digest: str


def _cand(call_id: str, cum_len: int = 3, digest: str = "d", context_len: int = 1) -> Cand:
    return Cand(call_id, cum_len, digest, context_len, conversation_prefix_digests(ITEMS)[context_len])


def test_selection_outcomes():
    assert select_parent("", ITEMS, lambda: None).status is ParentResolution.ROOT
    assert select_parent("fp", ITEMS, lambda: None).reason == INDEX_COLD
    assert select_parent("fp", ITEMS, lambda: []).reason == NO_MATCH
    wrong_context = dataclasses.replace(_cand("a"), context_digest="x" * 64)
    assert select_parent("fp", ITEMS, lambda: [wrong_context]).reason == NO_MATCH
    chosen = select_parent("fp", ITEMS, lambda: [_cand("b"), _cand("a")])  # identical tokens collapse
    assert chosen.status is ParentResolution.RESOLVED and chosen.parent.call_id == "a"
    two = select_parent("fp", ITEMS, lambda: [_cand("a"), _cand("b", digest="other")])
    assert (two.status, two.parent, two.reason) == (ParentResolution.UNRESOLVED, None, AMBIGUOUS)


def test_prefixes_hashed_by_the_caller_decide_as_the_rule_hashes_them():
    prefixes = conversation_prefix_digests(ITEMS)
    for found in ([_cand("a")], [_cand("b"), _cand("a")], [_cand("a"), _cand("b", digest="other")],
                  [dataclasses.replace(_cand("a"), context_digest="x" * 64)]):
        assert select_parent("fp", ITEMS, lambda f=found: f, prefixes) == select_parent("fp", ITEMS, lambda f=found: f)
    # The caller's digests are the ones compared: the items are not hashed again.
    assert select_parent("fp", [], lambda: [_cand("a")], prefixes).status is ParentResolution.RESOLVED


def test_candidates_are_only_looked_up_for_a_request_with_a_fingerprint():
    def boom():
        raise AssertionError("looked up")
    assert select_parent("", ITEMS, boom).status is ParentResolution.ROOT


def test_published_candidates_filter_by_fingerprint_and_version():
    call = make_call([1], [2], continuation_fingerprint="fp", continuation_context_len=1,
                     continuation_context_digest=conversation_prefix_digests(ITEMS)[1])
    old = dataclasses.replace(call, model_call_id="f" * 32, fingerprint_version=0)
    (only,) = published_candidates([call, old, dataclasses.replace(call, continuation_fingerprint="x")], "fp")
    assert isinstance(only, PublishedCandidate) and only.call is call
    assert select_parent("fp", ITEMS, lambda: [only]).parent is only


def test_delta_and_prefix_verification():
    parent = make_call([1, 2], [3])
    full = make_call([1, 2, 3, 4], [5])
    assert prefix_verified(full.prompt_token_ids, parent.cum_len, parent.digest)
    assert not prefix_verified([1, 2], parent.cum_len, parent.digest)  # shorter than the parent
    assert not prefix_verified([1, 9, 3, 4], parent.cum_len, parent.digest)
    delta = make_call([1, 2, 3, 4], [5], parent=parent.model_call_id, delta_of=[1, 2, 3], parent_digest=parent.digest)
    assert delta.prompt_token_ids == [4] and delta.prompt_is_delta and delta.digest == compute_digest([1, 2, 3, 4, 5])
    assert delta_parent_len(delta) == 3 and delta_link_holds(delta, parent.cum_len, parent.digest)
    assert not delta_link_holds(delta, parent.cum_len + 1, parent.digest)
    assert not delta_link_holds(delta, parent.cum_len, "other")
