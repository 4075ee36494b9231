"""Wire bytes of a long rollout: delta records against full-prompt records (budget: ≤ 15%).

Runs the same N-call, tool-using rollout twice through the interceptor (in
process, in front of the reference policy server, same seed), once with
``delta_records`` and once without, and sums the bytes of the Avro events each
run published. Prints both totals and the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--calls", type=int, default=50, help="model calls in the rollout")
    # Defaults model a coding harness: a long system prompt with tool instructions
    # (Claude Code's is ~15k tokens) and tool results of a few hundred tokens.
    parser.add_argument("--system-words", type=int, default=3000, help="size of the system prompt")
    parser.add_argument("--tool-output-words", type=int, default=150, help="size of each tool result")


class _Recorder:
    def __init__(self) -> None:
        self.bytes = 0
        self.events = 0

    async def publish_raw(self, topic: str, key: bytes, value: bytes) -> tuple[int, int]:
        self.bytes += len(key) + len(value)
        self.events += 1
        return 0, self.events

    async def close(self) -> int:
        return 0


async def rollout_bytes(*, calls: int, delta: bool, tool_words: int, system_words: int) -> tuple[int, int, int]:
    """(event bytes, events, final context tokens) of one rollout of ``calls`` calls."""
    import httpx

    from compose.policy import create_app
    from compose.policy.testkit import BASH
    from producers.app import Interceptor
    from producers.settings import InterceptorSettings

    recorder = _Recorder()
    upstream = httpx.AsyncClient(base_url="http://policy", transport=httpx.ASGITransport(app=create_app()))
    app = Interceptor(InterceptorSettings(upstream_url="http://policy", bootstrap="unused:1", delta_records=delta),
                      publisher=recorder, upstream=upstream)  # type: ignore[arg-type]
    await app.startup()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": f"You are a coding agent. #tool-calls={calls - 1} "
                                      + " ".join(f"rule {i}: keep the change small." for i in range(system_words // 6))},
        {"role": "user", "content": "Investigate the repository and report what you find."},
    ]
    output = " ".join(f"line{i} value {i * 7} ok" for i in range(tool_words // 4))
    last_usage = 0
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://tt", timeout=60) as http:
        for turn in range(calls):
            r = await http.post("/ng-rollout/wire-bench/training-token-capture/v1/chat/completions",
                                json={"model": "m", "messages": messages, "tools": [BASH], "seed": turn})
            r.raise_for_status()
            body = r.json()
            message = body["choices"][0]["message"]
            last_usage = body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]
            messages.append({k: v for k, v in message.items() if k in ("role", "content", "tool_calls") and v})
            for call in message.get("tool_calls") or []:
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"turn {turn}: {output}"})
            if not message.get("tool_calls"):
                break
    await app.shutdown()
    return recorder.bytes, recorder.events, last_usage


def main(args: argparse.Namespace) -> int:
    sizes = dict(calls=args.calls, tool_words=args.tool_output_words, system_words=args.system_words)
    full_bytes, full_events, context = asyncio.run(rollout_bytes(delta=False, **sizes))
    delta_bytes, delta_events, _ = asyncio.run(rollout_bytes(delta=True, **sizes))
    ratio = delta_bytes / full_bytes
    print(f"rollout: {full_events} calls, system prompt ~{args.system_words} words, tool results "
          f"~{args.tool_output_words} words, final context {context} tokens")
    print(f"full-prompt records: {full_bytes:>10,} bytes")
    print(f"delta records:       {delta_bytes:>10,} bytes")
    print(f"ratio delta/full:    {ratio:.1%}   (budget <= 15%: {'met' if ratio <= 0.15 else 'MISSED'})")
    return 0
