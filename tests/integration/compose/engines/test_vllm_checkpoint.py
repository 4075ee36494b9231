"""The tiny checkpoints are built here, deterministically, and the crafted one is an agent the
hermes parser and the chat template agree with (every emission re-renders to the sampled ids)."""

from __future__ import annotations

import json
import subprocess

import pytest

from compose.engines.vllm_rig.engine import ROOT, vllm_python
from tests.integration.engines import require_vllm

pytestmark = [pytest.mark.vllm]

PROBE = r"""
import json, sys
from transformers import AutoTokenizer
from compose.engines.vllm_rig.checkpoint import CALLS, ANSWER
tok = AutoTokenizer.from_pretrained(sys.argv[1])
out = {}
for call in CALLS:
    fn = json.loads(call.call)
    msgs = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": fn}]}]
    text = tok.apply_chat_template(msgs, tokenize=False)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    out[fn["name"]] = tok.convert_ids_to_tokens(ids)[-5:]
out["answer"] = tok(ANSWER, add_special_tokens=False)["input_ids"] == [tok.convert_tokens_to_ids(ANSWER)]
print(json.dumps(out))
"""


def _build(tmp_path, variant: str, name: str) -> dict:
    out = tmp_path / name
    subprocess.run([str(vllm_python()), "-m", "compose.engines.vllm_rig.checkpoint", str(out), variant], cwd=ROOT,
                   check=True, capture_output=True, timeout=300)
    return json.loads((out / "manifest.json").read_text())


@pytest.mark.parametrize("variant", ["crafted", "random"])
def test_two_builds_are_byte_identical(tmp_path, variant):
    require_vllm()
    first, second = _build(tmp_path, variant, "a"), _build(tmp_path, variant, "b")
    assert first == second and set(first["files"]) >= {"model.safetensors", "tokenizer.json", "config.json"}


def test_each_agent_emission_re_renders_to_whole_tokens(tmp_path):
    require_vllm()
    _build(tmp_path, "crafted", "c")
    probe = subprocess.run([str(vllm_python()), "-c", PROBE, str(tmp_path / "c")], cwd=ROOT, check=True,
                           capture_output=True, text=True, timeout=120)
    out = json.loads(probe.stdout.strip().splitlines()[-1])
    assert out.pop("answer") is True
    for name, tail in out.items():
        # <think></think><tool_call>{one token}</tool_call><|im_end|>: what the crafted model samples.
        assert tail[0] == "<tool_call>" and tail[2:] == ["</tool_call>", "<|im_end|>", "Ċ"], (name, tail)
        assert tail[1].startswith('\n{"name": "' + name + '"'), (name, tail)
