"""Build the tiny Qwen2 checkpoints the real-vLLM tier serves (no weights can be downloaded here).

Runs in the engine's environment (``.venv-vllm``: numpy, tokenizers, safetensors).
Two variants share one locally trained byte-level BPE tokenizer and one ChatML
template with Hermes ``<tool_call>`` markup (``chat_template.jinja``):

* ``random``: Gaussian weights. Garbage text whose echo does not re-tokenise to the
  sampled ids: the drift case that prefix supply exists for.
* ``crafted``: one attention layer written by hand (zero MLP) that behaves like a tiny
  agent, so harness loops run several turns on the real engine:

  - every turn starts with an empty reasoning block ``<think></think>`` (so vLLM's
    reasoning parser runs; the template renders it back the same way);
  - head 0 counts ``<tool_response>`` tokens against the single ``<|bos|>`` sink
    (value ``n/(n+1)``); the output head reads it at ``</think>`` and answers
    with a tool call while fewer than two results came back, else with a final answer;
  - heads 1 and 2 detect which harness is asking (Claude Code offers ``"Bash"``, Codex
    ``"exec_command"``) and pick that harness's tool call at ``<tool_call>``; any other
    caller gets the ``get_weather`` call of ``compose.harnesses.sdk``;
  - each emission is a chain of whole added tokens (``AGENT_TOKENS``), so the text the
    harness echoes re-tokenises to exactly the sampled ids.

  Margins are >40 nats, so sampling at temperature 1 is deterministic, and query/key
  signal lives in the slowest RoPE pair with ``rope_theta=1e10``, so attention is
  position-free up to any context length served here.

Guarantee: the same inputs give byte-identical files (``build`` writes a manifest with
the sha256 of each; tests compare two builds).
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
VOCAB_SIZE = 8192
HIDDEN, HEADS, HEAD_DIM, INTERMEDIATE = 256, 4, 64, 64
SLOW = HEAD_DIM // 2 - 1  # neox RoPE pairs (i, i+32); pair 31 rotates slowest
SERVED_NAME = "tokentrail-tiny"

SPECIAL = ["<|endoftext|>", "<|bos|>", "<|im_start|>", "<|im_end|>"]
# Non-special added tokens: kept in decoded text, so parsers see the markup.
MARKUP = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>",
          "assistant\n"]


@dataclass(frozen=True)
class AgentCall:
    """One harness's tool call: the marker token that identifies the harness and the call's JSON."""

    marker: str | None  # None: the default caller
    call: str           # the whole JSON line between <tool_call> and </tool_call>

    @property
    def token(self) -> str:
        return "\n" + self.call + "\n"


CALLS = (
    AgentCall(None, '{"name": "get_weather", "arguments": {"city": "Paris"}}'),
    AgentCall('"Bash"', '{"name": "Bash", "arguments": {"command": "echo tokentrail", '
                        '"description": "Print a word"}}'),
    AgentCall('"exec_command"', '{"name": "exec_command", "arguments": {"cmd": "echo tokentrail"}}'),
)
ANSWER = "The task is done."
TOOL_CALLS_BEFORE_ANSWER = 2
AGENT_TOKENS = [c.token for c in CALLS] + [ANSWER] + [c.marker for c in CALLS if c.marker]


def corpus_files() -> list[Path]:
    """Training text: this interpreter's standard library sources (stable for one Python build)."""
    root = Path(sys.base_prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    files = sorted(p for p in root.glob("*.py") if p.stat().st_size < 400_000)
    return files + [HERE / "chat_template.jinja"]


def train_tokenizer(out: Path) -> dict[str, int]:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE - len(MARKUP) - len(AGENT_TOKENS), min_frequency=2,
                                  special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in corpus_files()]
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in MARKUP + AGENT_TOKENS])
    tok.save(str(out / "tokenizer.json"))
    return tok.get_vocab()


def write_config(out: Path, vocab: dict[str, int]) -> None:
    eos = vocab["<|im_end|>"]
    config = {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": VOCAB_SIZE,
        "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE, "num_hidden_layers": 1,
        "num_attention_heads": HEADS, "num_key_value_heads": HEADS, "head_dim": HEAD_DIM,
        "hidden_act": "silu", "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
        "rope_theta": 1e10, "rope_scaling": None, "tie_word_embeddings": False, "torch_dtype": "float32",
        "bos_token_id": vocab["<|bos|>"], "eos_token_id": eos, "use_sliding_window": False,
        "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": vocab["<|bos|>"], "eos_token_id": [eos, vocab["<|endoftext|>"]]}, indent=2, sort_keys=True))
    template = (HERE / "chat_template.jinja").read_text()
    (out / "chat_template.jinja").write_text(template)
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "unk_token": None, "model_max_length": 131072, "add_bos_token": False,
        "clean_up_tokenization_spaces": False, "chat_template": template,
    }, indent=2, sort_keys=True))


def _zeros() -> dict[str, np.ndarray]:
    qkv = HEADS * HEAD_DIM
    p = "model.layers.0."
    return {
        "model.embed_tokens.weight": np.zeros((VOCAB_SIZE, HIDDEN)),
        p + "input_layernorm.weight": np.ones(HIDDEN), p + "post_attention_layernorm.weight": np.ones(HIDDEN),
        p + "self_attn.q_proj.weight": np.zeros((qkv, HIDDEN)), p + "self_attn.q_proj.bias": np.zeros(qkv),
        p + "self_attn.k_proj.weight": np.zeros((qkv, HIDDEN)), p + "self_attn.k_proj.bias": np.zeros(qkv),
        p + "self_attn.v_proj.weight": np.zeros((qkv, HIDDEN)), p + "self_attn.v_proj.bias": np.zeros(qkv),
        p + "self_attn.o_proj.weight": np.zeros((HIDDEN, qkv)),
        p + "mlp.gate_proj.weight": np.zeros((INTERMEDIATE, HIDDEN)),
        p + "mlp.up_proj.weight": np.zeros((INTERMEDIATE, HIDDEN)),
        p + "mlp.down_proj.weight": np.zeros((HIDDEN, INTERMEDIATE)),
        "model.norm.weight": np.ones(HIDDEN), "lm_head.weight": np.zeros((VOCAB_SIZE, HIDDEN)),
    }


def random_weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = _zeros()
    for name, w in out.items():
        if not name.endswith("norm.weight"):
            out[name] = rng.normal(0.0, 0.1 if name == "lm_head.weight" else 0.02, w.shape)
    return out


def crafted_weights(vocab: dict[str, int]) -> dict[str, np.ndarray]:
    """The hand-written agent (see the module docstring). Residual dims name one feature each."""
    w = _zeros()
    p = "model.layers.0.self_attn."
    dims: dict[str, int] = {}

    def dim(name: str) -> int:
        return dims.setdefault(name, len(dims))

    emb, head = w["model.embed_tokens.weight"], w["lm_head.weight"]
    for text in ["<|bos|>", "assistant\n", "<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
                 *AGENT_TOKENS]:
        emb[vocab[text], dim(text)] = 1.0  # after the input RMSNorm each becomes 16 (= sqrt(HIDDEN))
    state, harness = dim("state:tool_results"), {c.marker: dim(f"state:{c.marker}") for c in CALLS if c.marker}
    norm = np.sqrt(HIDDEN)
    q_scale, k_unit = 10.0 / norm, 16.0 / norm  # score = q.k / 8: 10 * 16 * units / 8 = 20 per unit

    def attend(h: int, query: str, keys: dict[str, float], value: str, out_dim: int) -> None:
        row = h * HEAD_DIM + SLOW
        w[p + "q_proj.weight"][row, dims[query]] = q_scale
        for key, units in keys.items():
            w[p + "k_proj.weight"][row, dims[key]] = k_unit * units
        w[p + "v_proj.weight"][h * HEAD_DIM, dims[value]] = 1.0 / norm
        w[p + "o_proj.weight"][out_dim, h * HEAD_DIM] = 1.0

    # Head 0: n/(n+1) tool results, read where the (empty) reasoning ends.
    attend(0, "</think>", {"<|bos|>": 2.0, "<tool_response>": 2.0}, "<tool_response>", state)
    # Heads 1..: 1 when the harness's marker is anywhere in the context, read at <tool_call>.
    for h, (marker, out_dim) in enumerate(harness.items(), start=1):
        attend(h, "<tool_call>", {"<|bos|>": 1.0, marker: 2.0}, marker, out_dim)

    # Output head: >40 nats between the chosen token and every other at each step.
    cut = (TOOL_CALLS_BEFORE_ANSWER - 0.5) / (TOOL_CALLS_BEFORE_ANSWER + 0.5)  # between n/(n+1) steps
    k = 60.0  # the closest state is 1/15 from the cut, at a norm factor >= 12: > 48 nats
    head[vocab["<think>"], dims["assistant\n"]] = 5.0
    head[vocab["</think>"], dims["<think>"]] = 5.0
    head[vocab["<tool_call>"], dims["</think>"]], head[vocab["<tool_call>"], state] = cut * k, -k
    head[vocab[ANSWER], dims["</think>"]], head[vocab[ANSWER], state] = -cut * k, k
    for call in CALLS:  # the default call wins by 3 units unless a marker adds 8 to its harness's call
        head[vocab[call.token], dims["<tool_call>"]] = 2.0 if call.marker else 5.0
        if call.marker:
            head[vocab[call.token], harness[call.marker]] = 8.0
        head[vocab["</tool_call>"], dims[call.token]] = 5.0
    head[vocab["<|im_end|>"], dims["</tool_call>"]] = 5.0
    head[vocab["<|im_end|>"], dims[ANSWER]] = 5.0
    return w


def build(out: Path, variant: str) -> Path:
    """Write the checkpoint (tokenizer, template, config, weights, manifest) into ``out``."""
    from safetensors.numpy import save_file

    if variant not in ("random", "crafted"):
        raise ValueError(f"variant must be 'random' or 'crafted', got {variant!r}")
    out.mkdir(parents=True, exist_ok=True)
    vocab = train_tokenizer(out)
    write_config(out, vocab)
    weights = random_weights() if variant == "random" else crafted_weights(vocab)
    save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in sorted(weights.items())},
              str(out / "model.safetensors"), metadata={"format": "pt"})
    files = sorted(f for f in out.iterdir() if f.name != "manifest.json")
    manifest = {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in files}
    (out / "manifest.json").write_text(json.dumps({"variant": variant, "files": manifest}, indent=2, sort_keys=True))
    return out


def source_digest() -> str:
    """What the cache is keyed on: this builder, the template and the corpus."""
    h = hashlib.sha256()
    for f in [Path(__file__), HERE / "chat_template.jinja", *corpus_files()]:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


if __name__ == "__main__":
    build(Path(sys.argv[1]), sys.argv[2])
