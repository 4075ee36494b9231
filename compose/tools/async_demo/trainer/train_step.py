"""The demo trainer: one GRPO-style policy-gradient step per delivered group, in PyTorch.

Runs in the engine's environment (``.venv-vllm``: torch, numpy), as a long-lived child of
``compose.tools.async_demo.run``: one JSON request per stdin line, one JSON reply per stdout line
(the model and the optimiser state stay in memory between steps). Request::

    {"weights_in": DIR | null, "weights_out": DIR, "label": "step-1", "lr": 0.002,
     "samples": [{"rollout_id", "token_ids", "loss_mask", "log_probs", "reward", "masked",
                  "versions": [label of each generated token]}]}

``weights_in`` (the served checkpoint) is read on the first request only. The reply names the
loss, the advantages and how far the trainer's log-probs of the tokens it was handed are from
the captured ones: ``on_policy_max_abs`` over tokens sampled by the weights the trainer holds
(0 up to float32 noise, the check that this forward is the served model), ``off_policy_mean_abs``
over older ones (what staleness costs).

The forward is the whole Qwen2 stack of ``compose.engines.vllm_rig.checkpoint`` (embedding, per-layer
RMSNorm, attention with neox RoPE and q/k/v biases, SiLU MLP, final norm, untied ``lm_head``),
read from the checkpoint's ``config.json``; every parameter is trained (Adam). Advantages:
``(reward - mean) / (std + 1e-6)`` over the group's unmasked members; masked members get none.
Loss: ``-sum_i A_i * sum_t log p(generated token t)`` divided by the number of generated tokens.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repo root: the safetensors reader/writer
from compose.engines.vllm_rig.weights import read_safetensors, write_safetensors

EPS = 1e-6


class Qwen2:
    """The served model's forward, over one sequence (float32, no KV cache)."""

    def __init__(self, checkpoint: Path) -> None:
        self.config = json.loads((checkpoint / "config.json").read_text())
        tensors: dict[str, np.ndarray] = {}
        for path in sorted(checkpoint.glob("*.safetensors")):
            tensors.update(read_safetensors(path))
        self.params = {k: torch.tensor(v, dtype=torch.float32, requires_grad=True) for k, v in tensors.items()}

    def _norm(self, x: torch.Tensor, weight: str) -> torch.Tensor:
        eps = self.config["rms_norm_eps"]
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * self.params[weight]

    def logprobs(self, ids: list[int]) -> torch.Tensor:
        """log p(ids[t] | ids[:t]) for t = 1..n-1 (the engine's prompt_logprobs, position for position)."""
        c, p = self.config, self.params
        heads, dim = c["num_attention_heads"], c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
        kv_heads = c.get("num_key_value_heads", heads)
        tokens = torch.tensor(ids, dtype=torch.long)
        n = len(ids)
        x = p["model.embed_tokens.weight"][tokens]
        inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        angles = torch.arange(n, dtype=torch.float32)[:, None] * inv_freq[None, :]
        cos, sin = torch.cat([angles.cos()] * 2, -1)[:, None, :], torch.cat([angles.sin()] * 2, -1)[:, None, :]

        def rope(t: torch.Tensor) -> torch.Tensor:  # neox: rotate the halves (i, i + dim/2)
            a, b = t[..., : dim // 2], t[..., dim // 2:]
            return t * cos + torch.cat([-b, a], -1) * sin

        causal = torch.full((n, n), float("-inf")).triu(1)
        for layer in range(c["num_hidden_layers"]):
            pre = f"model.layers.{layer}."
            h = self._norm(x, pre + "input_layernorm.weight")

            def proj(name: str, count: int, pre: str = pre, h: torch.Tensor = h) -> torch.Tensor:
                w, b = p[pre + f"self_attn.{name}.weight"], p.get(pre + f"self_attn.{name}.bias")
                out = h @ w.T + (b if b is not None else 0.0)
                return out.view(n, count, dim)

            q, k, v = rope(proj("q_proj", heads)), rope(proj("k_proj", kv_heads)), proj("v_proj", kv_heads)
            if kv_heads != heads:
                k, v = (t.repeat_interleave(heads // kv_heads, dim=1) for t in (k, v))
            scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(dim) + causal
            attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, heads * dim)
            x = x + attn @ p[pre + "self_attn.o_proj.weight"].T
            h = self._norm(x, pre + "post_attention_layernorm.weight")
            gate, up = h @ p[pre + "mlp.gate_proj.weight"].T, h @ p[pre + "mlp.up_proj.weight"].T
            x = x + (torch.nn.functional.silu(gate) * up) @ p[pre + "mlp.down_proj.weight"].T
        logits = self._norm(x, "model.norm.weight") @ p["lm_head.weight"].T
        logp = torch.log_softmax(logits[:-1], -1)
        return logp.gather(1, tokens[1:, None]).squeeze(1)

    def save(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        write_safetensors(out / "model.safetensors", {k: v.detach().numpy() for k, v in self.params.items()})


def advantages(samples: list[dict]) -> list[float | None]:
    """GRPO: (reward - mean) / (std + eps) over unmasked members; None for masked ones."""
    valid = [s["reward"] for s in samples if not s["masked"]]
    if not valid:
        return [None] * len(samples)
    mean = sum(valid) / len(valid)
    std = math.sqrt(sum((r - mean) ** 2 for r in valid) / len(valid))
    return [None if s["masked"] else (s["reward"] - mean) / (std + EPS) for s in samples]


class Trainer:
    def __init__(self) -> None:
        self.model: Qwen2 | None = None
        self.optimizer: torch.optim.Optimizer | None = None

    def step(self, request: dict) -> dict:
        if self.model is None:
            self.model = Qwen2(Path(request["weights_in"]))
            self.optimizer = torch.optim.Adam(self.model.params.values(), lr=request["lr"])
        assert self.optimizer is not None
        current = request.get("current_label")
        samples = request["samples"]
        adv = advantages(samples)
        self.optimizer.zero_grad()
        total, tokens, on_gap, on_n, off_gap, off_n = torch.zeros(()), 0, 0.0, 0, 0.0, 0
        for sample, a in zip(samples, adv):
            if a is None:
                continue
            ids, mask = sample["token_ids"], sample["loss_mask"]
            logp = self.model.logprobs(ids)  # logp[t - 1] is token t's
            positions = [t for t, bit in enumerate(mask) if bit]  # generated tokens; never position 0
            if len(positions) != len(sample["log_probs"]) or len(positions) != len(sample["versions"]) or (
                    positions and positions[0] == 0):
                raise ValueError(f"rollout {sample['rollout_id']}: {len(positions)} loss-bearing tokens, "
                                 f"{len(sample['log_probs'])} log-probs, {len(sample['versions'])} versions: "
                                 "a sample needs one log-prob and one version per generated token")
            picked = logp[torch.tensor(positions, dtype=torch.long) - 1]
            gaps = (picked.detach() - torch.tensor(sample["log_probs"], dtype=torch.float32)).abs()
            for gap, version in zip(gaps.tolist(), sample["versions"]):
                if version == current:
                    on_gap, on_n = max(on_gap, gap), on_n + 1
                else:
                    off_gap, off_n = off_gap + gap, off_n + 1
            total = total - a * picked.sum()
            tokens += len(positions)
        loss = total / max(tokens, 1)
        if tokens and any(a for a in adv if a):
            loss.backward()
            self.optimizer.step()
        self.model.save(Path(request["weights_out"]))
        return {"label": request["label"], "loss": float(loss), "tokens": tokens, "advantages": adv,
                "on_policy_max_abs": on_gap if on_n else None, "on_policy_tokens": on_n,
                "off_policy_mean_abs": off_gap / off_n if off_n else None, "off_policy_tokens": off_n}


def main() -> int:
    torch.manual_seed(0)
    torch.set_num_threads(1)  # the engine holds the other core
    trainer = Trainer()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            reply = trainer.step(json.loads(line))
        except Exception as exc:  # reported to the orchestrator, which stops the demo with it
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(reply), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
