"""Terminal attribution (each method, ambiguity → mask) and side-call rules, beyond NeMo Gym."""

from __future__ import annotations

import dataclasses

import pytest

from consumers.rebuild import RebuildRules, rebuild
from schemas.errors import ConfigError
from schemas.ids import response_id
from tests.factories import finished
from tests.unit.consumers.support import child, codes, declared, detail, root, snapshot_of, text_call, unresolved


def conversation():
    """root → a → b (the answer), an abandoned fork off a, and a later independent root."""
    r = root([1, 2], [3])
    a = child(r, [4], [5])
    b = text_call(child(a, [6], [7]), "It is sunny in Oslo.")
    fork = child(a, [8], [9])  # different new prompt: a branch, not a retry
    later = root([50, 51], [52], created_at=1e9)
    return r, a, b, fork, later


def attribution(out):
    t = out.metrics.terminal_attribution
    return t.method, t.call_id


# -- declared -------------------------------------------------------------------------

def test_declared_response_id_names_the_terminal_and_other_chains_are_reported():
    r, a, b, fork, later = conversation()
    out = rebuild(snapshot_of(r, a, b, fork, later, finish=declared(b)))
    assert not out.mask_sample
    assert attribution(out) == ("declared", b.model_call_id)
    assert out.metrics.terminal_attribution.chain == "main"
    assert [s.model_call_id for s in out.trajectory.spans] == [r.model_call_id, a.model_call_id, b.model_call_id]
    reports = {c["kind"]: c["call_ids"] for c in detail(out)["chain_reports"]}
    assert reports["abandoned"] == [r.model_call_id, a.model_call_id, fork.model_call_id]
    assert reports["other_root"] == [later.model_call_id]
    assert out.metrics.chains == 3 and out.metrics.roots == 2


def test_a_response_id_recorded_verbatim_in_the_facts_also_declares():
    r, a, b, fork, later = conversation()
    fork = dataclasses.replace(fork, facts=dataclasses.replace(fork.facts, response_id="engine-xyz"))
    out = rebuild(snapshot_of(r, a, b, fork, later, finish=finished(final_response_id="engine-xyz")))
    assert attribution(out) == ("declared", fork.model_call_id) and not out.mask_sample


def test_declared_call_that_was_not_captured_masks():
    r, a, b, *_ = conversation()
    out = rebuild(snapshot_of(r, a, b, finish=finished(final_response_id=response_id("msg_", "e" * 32))))
    assert out.mask_sample and codes(out) == ["terminal_not_captured"]
    assert out.mask_reasons[0].call_ids == ["e" * 32] and out.trajectory is None


def test_declared_side_call_masks():
    r, a, b, *_ = conversation()
    title = root([7, 7], [8], facts={"tools_present": False})
    out = rebuild(snapshot_of(r, a, b, title, finish=declared(title)))
    assert codes(out) == ["terminal_is_side_call"]


def test_an_unrecognised_response_id_is_reported_and_ignored():
    r, a, b, *_ = conversation()
    out = rebuild(snapshot_of(r, a, b, finish=finished(final_response_id="resp_from_elsewhere")))
    assert attribution(out) == ("single_chain", b.model_call_id) and not out.mask_sample
    assert detail(out)["terminal"]["declared"] == "unrecognised"


def test_declared_terminal_resolves_a_final_call_retry():
    r = root([1, 2], [3])
    first, retry = child(r, [4], [5]), child(r, [4], [6])
    out = rebuild(snapshot_of(r, first, retry, finish=declared(retry)))
    assert not out.mask_sample and attribution(out) == ("declared", retry.model_call_id)
    assert detail(out)["quarantined_call_ids"] == [first.model_call_id]
    assert detail(out)["unresolved_retries"] == []


# -- content --------------------------------------------------------------------------

def test_unique_content_match_attributes_and_resolves_a_final_retry():
    r = root([1, 2], [3])
    first = text_call(child(r, [4], [5]), "Paris")
    retry = text_call(child(r, [4], [6]), "  Paris,\nFrance ")
    out = rebuild(snapshot_of(r, first, retry, finish=finished(final_text="Paris, France")))
    assert not out.mask_sample and attribution(out) == ("content", retry.model_call_id)


def test_several_content_matches_fall_through_and_an_ambiguous_retry_masks():
    r = root([1, 2], [3])
    first = text_call(child(r, [4], [5]), "Paris")
    retry = text_call(child(r, [4], [6]), "Paris")
    out = rebuild(snapshot_of(r, first, retry, finish=finished(final_text="Paris")))
    assert detail(out)["terminal"]["content_matches"] == sorted([first.model_call_id, retry.model_call_id])
    assert out.mask_sample and codes(out) == ["unresolved_retry"]


def test_declared_outranks_content():
    r, a, b, fork, later = conversation()
    out = rebuild(snapshot_of(r, a, b, fork, later, finish=declared(fork, final_text="It is sunny in Oslo.")))
    assert attribution(out) == ("declared", fork.model_call_id)


# -- heuristic ------------------------------------------------------------------------

def test_heuristic_descends_past_a_dead_side_branch():
    r = root([1, 2], [3])
    dead = child(r, [9], [9])
    a = child(r, [4], [5])
    b = child(a, [6], [7])
    out = rebuild(snapshot_of(r, dead, a, b))
    assert not out.mask_sample and attribution(out) == ("heuristic", b.model_call_id)
    assert {c["kind"] for c in detail(out)["chain_reports"]} == {"delivered", "abandoned"}


def test_heuristic_ambiguity_masks():
    r = root([1, 2], [3])
    x, y = child(r, [4], [5]), child(r, [6], [7])  # two different continuations, both leaves
    out = rebuild(snapshot_of(r, x, y))
    assert out.mask_sample and codes(out) == ["terminal_ambiguous"]
    assert out.mask_reasons[0].call_ids == sorted([x.model_call_id, y.model_call_id])
    x2, y2 = child(x, [1], [1]), child(y, [1], [1])  # two extended branches
    assert codes(rebuild(snapshot_of(r, x, y, x2, y2))) == ["terminal_ambiguous"]


def test_an_extended_root_beats_an_earlier_abandoned_root():
    early = root([5, 5], [6], created_at=1.0)
    main = root([1, 2], [3], created_at=2.0)
    nxt = child(main, [4], [5], created_at=3.0)
    out = rebuild(snapshot_of(early, main, nxt))
    assert attribution(out) == ("heuristic", nxt.model_call_id) and not out.mask_sample


def test_terminal_methods_can_forbid_guessing():
    r, a, b, *_ = conversation()
    out = rebuild(snapshot_of(r, a, b), RebuildRules(terminal_methods=("declared", "content")))
    assert codes(out) == ["no_terminal"]
    ok = rebuild(snapshot_of(r, a, b, finish=finished(final_text="It is sunny in Oslo.")),
                 RebuildRules(terminal_methods=("content",)))
    assert attribution(ok) == ("content", b.model_call_id)


def test_a_boundary_inside_the_ancestry_masks_and_one_elsewhere_is_reported():
    u = unresolved([1, 2], [3])
    nxt = child(u, [4], [5])
    assert codes(rebuild(snapshot_of(u, nxt, finish=declared(nxt)))) == ["unresolved_parent"]
    r, a, b, *_ = conversation()
    stray = unresolved([70, 71], [72])
    out = rebuild(snapshot_of(r, a, b, stray, finish=declared(b)))
    assert not out.mask_sample and out.metrics.unresolved_parent_calls == 1
    assert detail(out)["unresolved_parent_call_ids"] == [stray.model_call_id]


# -- side calls -----------------------------------------------------------------------

def sc(prompt, gen, model, tools=True, **kw):
    return root(prompt, gen, requested_model=model, facts={"tools_present": tools}, **kw)


def test_model_patterns_mark_side_calls():
    main = sc([1, 2], [3], "claude-sonnet-4-5")
    small = sc([5], [6, 6], "claude-haiku-4-5")
    rules = RebuildRules(side_call_models=("HAIKU",), self_calibrate=False)
    out = rebuild(snapshot_of(main, small), rules)
    assert out.metrics.side_calls_excluded == 1 and not out.mask_sample
    assert detail(out)["side_calls"] == [{"call_id": small.model_call_id, "rule": "pattern",
                                          "requested_model": "claude-haiku-4-5"}]


def test_self_calibration_keeps_the_model_with_the_most_generated_tokens():
    main = sc([1, 2], [3, 3, 3, 3], "big")
    nxt = child(main, [4], [5, 5], requested_model="big")
    small = sc([5], [6, 6, 6], "small")
    out = rebuild(snapshot_of(main, nxt, small))
    assert [c["rule"] for c in detail(out)["side_calls"]] == ["self_calibration"]
    assert out.metrics.generated_tokens_captured == 6 and out.metrics.delivered_fraction == 1.0
    off = rebuild(snapshot_of(main, nxt, small), RebuildRules(self_calibrate=False, toolless_max_tokens=0))
    assert off.metrics.side_calls_excluded == 0


def test_an_explicit_policy_model_wins_over_calibration():
    main = sc([1, 2], [3], "policy")
    big_side = sc([5], list(range(50)), "helper")
    out = rebuild(snapshot_of(main, big_side), RebuildRules(policy_model="policy"))
    assert detail(out)["side_calls"][0]["rule"] == "policy_model"
    assert attribution(out) == ("single_chain", main.model_call_id)


def test_toolless_short_roots_are_side_calls_only_in_tool_using_rollouts():
    main = root([1, 2], [3])
    nxt = child(main, [4], [5])
    title = root([9, 9], [7, 7], facts={"tools_present": False})
    out = rebuild(snapshot_of(main, nxt, title))
    assert detail(out)["side_calls"][0]["rule"] == "toolless_short"
    chat = [root([1, 2], [3], facts={"tools_present": False})]
    chat.append(child(chat[0], [4], [5], facts={"tools_present": False}))
    plain = rebuild(snapshot_of(*chat))
    assert plain.metrics.side_calls_excluded == 0 and not plain.mask_sample
    long = root([9, 9], list(range(100)), facts={"tools_present": False})
    assert rebuild(snapshot_of(main, nxt, long), RebuildRules(toolless_max_tokens=64)).metrics.side_calls_excluded == 0


def test_all_side_calls_masks():
    rules = RebuildRules(side_call_models=("haiku",))
    out = rebuild(snapshot_of(sc([1], [2], "haiku-a"), sc([3], [4], "haiku-b")), rules)
    assert out.mask_sample and codes(out) == ["all_side_calls"]
    assert out.metrics.error == "all captured calls were side calls" and out.metrics.side_calls_excluded == 2


def test_a_side_call_inside_a_conversation_is_spliced_out_as_context():
    main = sc([1, 2], [3], "policy")
    helper = child(main, [4], [5, 5], requested_model="haiku")
    back = child(helper, [6], [7], requested_model="policy")
    out = rebuild(snapshot_of(main, helper, back, finish=declared(back)), RebuildRules(side_call_models=("haiku",)))
    assert not out.mask_sample
    assert out.trajectory.token_ids == [1, 2, 3, 4, 5, 5, 6, 7]
    assert list(out.trajectory.loss_mask) == [0, 0, 1, 0, 0, 0, 0, 1]  # the side call's output is context
    assert detail(out)["chain_reports"][-1]["kind"] == "side"


def test_rules_validate_and_round_trip():
    rules = RebuildRules(side_call_models=(" Haiku ",), terminal_methods=("heuristic", "declared"))
    assert rules.side_call_models == ("haiku",) and rules.terminal_methods == ("declared", "heuristic")
    assert RebuildRules.from_mapping(rules.to_mapping()) == rules
    for bad in ({"delivery_mode": "tree"}, {"terminal_methods": ["psychic"]}, {"toolless_max_tokens": -1},
                {"side_call_models": "haiku"}, {"policy_model": ""}, {"typo": 1}):
        with pytest.raises(ConfigError):
            RebuildRules.from_mapping(bad)
