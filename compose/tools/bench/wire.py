"""Wire bytes of a long rollout: delta records against full-prompt records (budgets: ≤ 4% at 50 calls,
≤ 8 bytes per generated token).

Runs the same N-call, tool-using rollout twice through the interceptor (in
process, in front of the reference policy server, same seed), once with
``delta_records`` and once without, and sums the bytes of the Avro events each
run published (key + value: what Kafka stores before batch compression). Prints
both totals and the ratio, then the delta run per call: bytes by event kind and
by CallCaptured field (the sizing inputs of docs/SCALING.md), and what zlib at
level 1 makes of each record, as an estimate of what a compressing producer
(``compression.type``, off in tokentrail's producers: see schemas/kafka/config.py) would save.
The reference engine returns float32 log-probs as vLLM does, so they travel as float32
(``schemas.wire_kinds.packed_log_probs``). Last, ``BUDGET``/``FIGURE`` lines for ``make bench``.
"""

from __future__ import annotations

import argparse
import asyncio
import zlib
from collections import Counter
from typing import Any

from compose.tools.bench.budgets import budget_line, figure_line


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--calls", type=int, default=50, help="model calls in the rollout")
    # Defaults model a coding harness: a long system prompt with tool instructions
    # (Claude Code's is ~15k tokens) and tool results of a few hundred tokens.
    parser.add_argument("--system-words", type=int, default=3000, help="size of the system prompt")
    parser.add_argument("--tool-output-words", type=int, default=150, help="size of each tool result")
    parser.add_argument("--max-model-len", type=int, default=131072,
                        help="the reference engine's context limit (long rollouts need room)")


BUDGET_RATIO = 0.04
BUDGET_BYTES_PER_GENERATED_TOKEN = 8.0  # generated id + its log-prob
# Token ids are packed u32 (schemas/avro/tokentrail.CallCaptured.avsc): bytes per id.
_ID_BYTES = 4


class _Recorder:
    """Sums the records the interceptor publishes, by event kind and (for captures) by field."""

    def __init__(self) -> None:
        self.bytes = 0
        self.events = 0
        self.zlib_bytes = 0
        self.by_kind: Counter[str] = Counter()
        self.by_field: Counter[str] = Counter()
        self.captures = 0
        self.generated_tokens = 0
        self.version_bytes = 0  # what the per-token version facts add to the captures

    async def produce(self, topic: str, key: bytes, value: bytes) -> tuple[int, int]:
        from dataclasses import replace

        from schemas.codec import decode_event, encode_event
        from schemas.records import CallCaptured
        from schemas.wire_kinds import packed_log_probs

        size = len(key) + len(value)
        self.bytes += size
        self.events += 1
        self.zlib_bytes += len(key) + len(zlib.compress(value, 1))
        event = decode_event(value)
        body = event.body
        self.by_kind[type(body).__name__] += size
        if isinstance(body, CallCaptured):
            self.captures += 1
            self.version_bytes += len(value) - len(encode_event(replace(event, body=replace(body, facts=replace(
                body.facts, version_spans=[], version_spans_source="", dispatch_version=None,
                completion_version=None)))))
            parts = {"prompt ids": _ID_BYTES * len(body.prompt_token_ids),
                     "generated ids": _ID_BYTES * len(body.generation_token_ids),
                     "log-probs": len(packed_log_probs(body.generation_log_probs)),
                     "output items (text)": len(body.output_items_json.encode())}
            self.by_field.update(parts)
            self.generated_tokens += len(body.generation_token_ids)
            self.by_field["ids, facts, framing"] += size - sum(parts.values())
        return 0, self.events

    async def close(self) -> int:
        return 0


async def rollout_bytes(*, calls: int, delta: bool, tool_words: int, system_words: int,
                        max_model_len: int, version: str | None = None) -> tuple[_Recorder, int, int]:
    """(what was published, model calls made, final context tokens) of one rollout of up to ``calls`` calls."""
    import httpx

    from compose.engines.policy import create_app
    from compose.engines.policy.testkit import BASH
    from producers.http.app import Interceptor
    from producers.settings import InterceptorSettings

    recorder = _Recorder()
    upstream = httpx.AsyncClient(base_url="http://policy", transport=httpx.ASGITransport(app=create_app(max_model_len=max_model_len)))
    app = Interceptor(InterceptorSettings(upstream_url="http://policy", bootstrap="unused:1", delta_records=delta),
                      publisher=recorder, upstream=upstream)  # type: ignore[arg-type]
    await app.startup()
    if version is not None:  # an announced policy version: every capture records its per-token spans
        app.core.clock.set_admin(version)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": f"You are a coding agent. #tool-calls={calls - 1} "
                                      + " ".join(f"rule {i}: keep the change small." for i in range(system_words // 6))},
        {"role": "user", "content": "Investigate the repository and report what you find."},
    ]
    output = " ".join(f"line{i} value {i * 7} ok" for i in range(tool_words // 4))
    last_usage, made = 0, 0
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://tt", timeout=60) as http:
        for turn in range(calls):
            r = await http.post("/ng-rollout/wire-bench/training-token-capture/v1/chat/completions",
                                json={"model": "m", "messages": messages, "tools": [BASH], "seed": turn})
            r.raise_for_status()
            made += 1
            body = r.json()
            message = body["choices"][0]["message"]
            last_usage = body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]
            messages.append({k: v for k, v in message.items() if k in ("role", "content", "tool_calls") and v})
            for call in message.get("tool_calls") or []:
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"turn {turn}: {output}"})
            if not message.get("tool_calls"):
                break
    await app.shutdown()
    return recorder, made, last_usage


def main(args: argparse.Namespace) -> int:
    sizes = dict(calls=args.calls, tool_words=args.tool_output_words, system_words=args.system_words,
                 max_model_len=args.max_model_len)
    full, calls, context = asyncio.run(rollout_bytes(delta=False, **sizes))
    delta, _, _ = asyncio.run(rollout_bytes(delta=True, **sizes))
    ratio = delta.bytes / full.bytes
    print(f"rollout: {calls} calls ({delta.events} events), system prompt ~{args.system_words} words, tool results "
          f"~{args.tool_output_words} words, final context {context} tokens")
    print(f"full-prompt records: {full.bytes:>10,} bytes")
    print(f"delta records:       {delta.bytes:>10,} bytes")
    print(f"ratio delta/full:    {ratio:.1%}   (budget <= {BUDGET_RATIO:.0%}: "
          f"{'met' if ratio <= BUDGET_RATIO else 'MISSED'})")
    print(f"delta records per call: {delta.bytes / calls:,.0f} bytes; zlib level 1 per record: "
          f"{delta.zlib_bytes / calls:,.0f} bytes ({delta.zlib_bytes / delta.bytes:.0%})")
    print("  by event kind:  " + ", ".join(f"{k} {v / calls:,.0f}" for k, v in delta.by_kind.most_common()))
    print("  CallCaptured:   " + ", ".join(f"{k} {v / calls:,.0f}" for k, v in delta.by_field.most_common()))
    per_token = (delta.by_field["generated ids"] + delta.by_field["log-probs"]) / max(1, delta.generated_tokens)
    print(f"per generated token: {per_token:.2f} bytes (id + log-prob; budget <= {BUDGET_BYTES_PER_GENERATED_TOKEN:g})")
    versioned, _, _ = asyncio.run(rollout_bytes(delta=True, version="step-000042", **sizes))
    per_call = versioned.version_bytes / max(1, versioned.captures)
    print(f"per-token versions (one announced version, one span per call): +{per_call:,.0f} bytes per call, "
          f"{versioned.version_bytes / versioned.bytes:.2%} of the delta records "
          f"({versioned.bytes:,} bytes with them, {versioned.bytes - versioned.version_bytes:,} without)")
    print(budget_line("wire.delta_ratio", ratio, BUDGET_RATIO))
    print(budget_line("wire.bytes_per_generated_token", per_token, BUDGET_BYTES_PER_GENERATED_TOKEN))
    print(figure_line("wire.delta_bytes_per_call", delta.bytes / calls))
    print(figure_line("wire.fixed_bytes_per_call", (delta.by_field["ids, facts, framing"]
                                                    + delta.by_kind["CallStarted"]) / calls))
    return 0
