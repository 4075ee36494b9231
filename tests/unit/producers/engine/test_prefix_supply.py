"""Prefix supply: the splice rule (pure) and the edge that renders, supplies and proves it, against a
FakeVLLM whose template drops reasoning from history (so only supplied ids keep the token chain)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from producers.engine.prefix_supply import Splice, ends_with_stop, ineligible, render_bodies, splice
from schemas.errors import ConfigError
from schemas.records import CallCaptured, CallIncomplete, ParentResolution
from tests.unit.producers.fake_vllm import EOS, FakeVLLM

CHAT = "/ng-rollout/{rid}/training-token-capture/v1/chat/completions"
USER = {"role": "user", "content": "list the files"}

# -- the pure rule ------------------------------------------------------------------------------


def test_the_rule_imports_the_stdlib_only():
    code = ("import json, sys; before = set(sys.modules); import producers.engine.prefix_supply\n"
            "new = {m.split('.')[0] for m in set(sys.modules) - before}\n"
            "print(json.dumps(sorted(new - set(sys.stdlib_module_names))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[4], capture_output=True,
                         text=True, check=True)
    # Our own packages only (the package surfaces resolve through schemas.surface): no third-party import.
    assert set(json.loads(out.stdout.strip().splitlines()[-1])) <= {"producers", "schemas"}


def test_splice_keeps_the_parents_ids_and_appends_the_new_turns_after_its_stop_token():
    parent = [10, 11, 4, 50, 5, 60, EOS]  # prompt, <think> 50 </think>, answer, EOS
    through_parent = [10, 11, 60, EOS, 3]  # the template drops the reasoning, closes with EOS + "\n"
    full = through_parent + [1, 70, EOS, 3, 1, 80]
    assert splice(parent, through_parent, full) == Splice(parent + [3, 1, 70, EOS, 3, 1, 80])


def test_splice_cuts_after_the_last_stop_token_of_the_parent_render():
    parent = [7, EOS, 8, EOS]
    through_parent = [7, EOS, 3, 8, EOS, 3]
    assert splice(parent, through_parent, through_parent + [9]).ids == parent + [3, 9]


def test_a_parent_cut_short_gets_the_templates_turn_end_found_by_emptying_its_text():
    parent = [10, 11, 60, 61]  # prompt, then a generation cut by max_tokens (no EOS)
    through_parent = [10, 11, 62, EOS, 3]  # its text re-rendered (differently), EOS + "\n" close the turn
    emptied = [10, 11, EOS, 3]
    full = through_parent + [1, 70]
    assert splice(parent, through_parent, full, emptied) == Splice(parent + [EOS, 3, 1, 70])


def test_the_turn_end_never_reaches_into_the_shared_head():
    # The parent's text ends with the token the turn starts with: the tail match must stop at the head.
    assert splice([5, 9], [5, 9, EOS], [5, 9, EOS, 1], [5, EOS]).ids == [5, 9, EOS, 1]
    assert splice([5], [5, 7], [5, 7, 1], [5, 7]) == Splice(None, "turn_end_not_in_template")


@pytest.mark.parametrize(("parent", "through", "full", "reason"), [
    ([1, EOS], [1, EOS], [1, 99, 5], "template_not_prefix_stable"),  # (b) does not start with (a)
    ([1, EOS], [1, EOS, 3], [1, EOS], "template_not_prefix_stable"),  # (b) shorter than (a)
    ([1, 42], [1, 43], [1, 43, 5], "stop_token_not_in_template"),
    ([], [1], [1, 2], "parent_has_no_ids"),
])
def test_splice_refuses_what_it_cannot_prove(parent, through, full, reason):
    assert splice(parent, through, full) == Splice(None, reason)


@pytest.mark.parametrize(("finish", "stop_reason", "expected"), [
    ("stop", None, True), ("tool_calls", None, True), ("stop", 151645, True),  # EOS, stop_token_ids
    ("stop", "</answer>", False), ("length", None, False), ("repetition", None, False), ("stop", True, False),
])
def test_only_a_generation_that_ended_on_a_stop_token_can_be_spliced(finish, stop_reason, expected):
    assert ends_with_stop(finish, stop_reason) is expected


def test_what_vllm_would_not_take_supplied_ids_for_is_ineligible():
    history = [USER, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "and now?"}]
    assert ineligible({"messages": history}) == ""
    assert ineligible({"messages": [USER]}) == "no_assistant_turn"
    assert ineligible({"messages": history, "continue_final_message": True}) == "continues_final_message"
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
    assert ineligible({"messages": history + [image]}) == "non_text_content"


def test_render_bodies_cut_after_the_parents_turn_and_drop_generation_fields():
    body = {"model": "m", "tools": [{"type": "function", "function": {"name": "ls"}}], "max_tokens": 128000,
            "stream": True, "stream_options": {"include_usage": True},
            "messages": [USER, {"role": "assistant", "content": "a"}, {"role": "tool", "content": "b"}]}
    through, full = render_bodies(body)
    assert through["messages"] == body["messages"][:2] and through["add_generation_prompt"] is False
    assert full["messages"] == body["messages"] and "add_generation_prompt" not in full
    for rendered in (through, full):
        assert rendered["tools"] == body["tools"] and rendered["model"] == "m"
        assert not {"max_tokens", "stream", "stream_options"} & set(rendered)


# -- the edge -----------------------------------------------------------------------------------


def captured(publisher) -> list[CallCaptured]:
    return [e.body for e in publisher.events if isinstance(e.body, CallCaptured)]


async def _two_turns(http, engine, rid, stream=False):
    first = await http.post(CHAT.format(rid=rid), json={"model": "m", "messages": [USER], "stream": stream})
    assert first.status_code == 200, first.text
    # The harness echoes the answer without the reasoning it was shown (as Claude Code does).
    answer = f"answer {engine.turn}"
    history = [USER, {"role": "assistant", "content": answer}, {"role": "user", "content": "go on"}]
    return await http.post(CHAT.format(rid=rid), json={"model": "m", "messages": history, "stream": stream})


@pytest.mark.parametrize("stream", [False, True])
async def test_supplied_ids_keep_the_sampled_tokens_of_the_parent(over_engine, publisher, stream):
    engine = FakeVLLM()
    http, _ = await over_engine(engine, prefix_supply=True)
    second = await _two_turns(http, engine, f"px-{stream}", stream)
    assert second.status_code == 200, second.text
    parent, child = captured(publisher)
    cum = parent.prompt_token_ids + parent.generation_token_ids
    sent = engine.bodies()[-1]["kv_transfer_params"]["prompt_token_ids"]
    assert sent[: len(cum)] == cum and len(sent) > len(cum)
    assert child.parent_resolution is ParentResolution.RESOLVED and child.parent_call_id == parent.model_call_id
    assert child.prefix_requested and child.prefix_supplied and child.prompt_is_delta
    assert cum + child.prompt_token_ids == sent  # the delta is exactly the supplied new turns
    assert engine.paths().count("/v1/chat/completions/render") == 2 + 2  # startup probes + (a) and (b)
    assert child.prefix_route == "/v1/chat/completions"  # no token-in stream here: the 0.32 way


async def test_without_supply_the_rerendered_history_loses_the_reasoning(over_engine, publisher):
    engine = FakeVLLM()
    http, _ = await over_engine(engine)
    await _two_turns(http, engine, "px-off")
    parent, child = captured(publisher)
    assert child.parent_resolution is ParentResolution.RESOLVED
    assert not child.prefix_requested and not child.prompt_is_delta
    assert child.prompt_token_ids[: parent.cum_len] != parent.prompt_token_ids + parent.generation_token_ids


async def test_an_engine_that_then_ignores_the_ids_fails_the_call_with_evidence(over_engine, publisher):
    engine = FakeVLLM()
    http, _ = await over_engine(engine, prefix_supply=True)
    engine.honour_kv = False  # passed the startup probe, then (say) a restart without the feature
    second = await _two_turns(http, engine, "px-ign")
    assert second.status_code == 502 and second.json()["error"]["type"] == "prefix_not_applied"
    (parent,) = captured(publisher)
    (marker,) = [e.body for e in publisher.events if isinstance(e.body, CallIncomplete)]
    assert marker.reason == "prefix_not_applied" and "kv_transfer_params.prompt_token_ids" in marker.detail


async def test_a_template_that_is_not_prefix_stable_is_sent_unsupplied(over_engine, publisher):
    class Unstable(FakeVLLM):
        def render(self, messages, tools=None, *, add_generation_prompt=True):
            ids = super().render(messages, tools, add_generation_prompt=add_generation_prompt)
            return ids if add_generation_prompt else ids + self.encode("trailing")

    engine = Unstable()
    http, _ = await over_engine(engine, prefix_supply=True)
    second = await _two_turns(http, engine, "px-unst")
    assert second.status_code == 200
    _, child = captured(publisher)
    assert child.prefix_requested and not child.prefix_supplied
    assert "kv_transfer_params" not in engine.bodies()[-1]


async def test_a_parent_cut_short_by_max_tokens_is_spliced_before_the_templates_turn_end(over_engine, publisher):
    engine = FakeVLLM()
    http, _ = await over_engine(engine, prefix_supply=True)
    r = await http.post(CHAT.format(rid="px-len"), json={"model": "m", "messages": [USER], "max_tokens": 3})
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"
    history = [USER, {"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
               {"role": "user", "content": "go on"}]
    await http.post(CHAT.format(rid="px-len"), json={"model": "m", "messages": history})
    parent, child = captured(publisher)
    assert child.parent_resolution is ParentResolution.RESOLVED and child.prefix_requested and child.prefix_supplied
    supplied = engine.bodies()[-1]["kv_transfer_params"]["prompt_token_ids"]
    cum = list(parent.prompt_token_ids) + list(parent.generation_token_ids)
    assert supplied[: len(cum)] == cum and supplied[len(cum)] == EOS  # the template's turn end follows the cut


@pytest.mark.parametrize(("engine", "says"), [
    (FakeVLLM(has_render=False), "render chat requests"),
    (FakeVLLM(honour_kv=False), "does not honour kv_transfer_params.prompt_token_ids"),
])
async def test_startup_refuses_an_engine_that_cannot_take_supplied_ids(over_engine, engine, says):
    with pytest.raises(ConfigError, match=rf"--prefix-supply.*{says}.*turn prefix supply off"):
        await over_engine(engine, prefix_supply=True)


async def test_the_startup_probe_uses_the_served_model_and_the_engine_key(over_engine):
    engine = FakeVLLM(served=("qwen-policy",), api_key="k-engine")
    await over_engine(engine, prefix_supply=True, upstream_api_key="k-engine")
    probe = [r for r in engine.requests if r["path"] != "/v1/models"]
    # The kv_transfer_params probe (render, chat) and the token-in route's (a render this engine answers
    # without parse_context: not vLLM 0.34's, so no generate request follows).
    assert [r["body"]["model"] for r in probe] == ["qwen-policy"] * 3
    assert [r["path"] for r in probe][-1] == "/v1/chat/completions/render"
    assert all(r["headers"]["authorization"] == "Bearer k-engine" for r in engine.requests)
