"""Rebuild time for rollouts of 10-200 calls and 8k-128k tokens, compact trajectory and with projection.

Each rollout is one tool-using conversation folded by the real processor fold
(``processors.fold``), so the snapshot holds what production holds: verified
delta prompts. The benchmark times ``rebuild(snapshot, rules)`` only (the
snapshot is decoded beforehand; its decode time is printed apart), the median
of ``--repeat`` runs, and prints ns per token so linear growth shows as a flat
column. Budgets (ARCHITECTURE §8): the compact trajectory of 200 calls / 128k
tokens in at most 5 ms; with NeMo RL's projection, within 1.5x of one copy of
the projection's text. The projection repeats the running prompt on every
call's carrier item (calls x tokens: ~90 MB of JSON text at 200 x 128k), so no
text projection can be produced faster than one copy of a string of its size:
the benchmark times that copy in the same run, alternating with the rebuild (a
busy machine slows both alike), and judges the median of their ratios.
``--gym-src`` (a checkout of NVIDIA-NeMo/Gym, never
vendored here) also times NeMo Gym's builder with its projection on the same
rollouts, in the same process, and prints the ratio.

``--tree`` (on by default) then times ``delivery_mode="traces"`` on a tree of
the largest size (``compose.tools.bench._rebuild_tree``: a main chain in 3 segments
joined by 2 compactions, and 8 sub-agents) against terminal mode on a single
chain of the same calls and unique tokens, timed alternately in the same run.
Budget: the traces, without the projection, within 2x of the single chain. It
also prints the traces by kind and the compact tree's stored tokens against the
unique tokens counted from the snapshot alone (equal when nothing is stored
twice) and against every trace written out whole.

The last lines are one per budget judged, for collecting into a table:
``BUDGET <name> value=<number> budget=<op><number> [baseline=<number>
ratio=<number>] ok=<true|false>`` (``compose.tools.bench.budgets.budget_line``;
every budget here is an upper bound, and where the value is itself a ratio to
the baseline the ratio column is the value): ``rebuild.compact_ms`` (only
when the largest rollout timed is the budget's 200 calls / 131072 tokens),
``rebuild.projection_ratio`` (baseline: the copy's ms) and, with ``--tree``,
``rebuild.tree_ratio`` (baseline: the single chain's ms).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from compose.tools.bench.budgets import budget_line

BUDGET_COMPACT_MS = 5.0
BUDGET_COMPACT_AT = (200, 131_072)  # (calls, tokens) the compact budget is set at
BUDGET_PROJECTION_RATIO = 1.5  # the rebuild with the projection / one copy of the projection's text
BUDGET_TREE_RATIO = 2.0
COMPACT_BUDGET_RUNS = 31  # runs behind the compact budget's median (at least --repeat)
DEFAULT_CALLS = (10, 50, 100, 200)
DEFAULT_TOKENS = (8_192, 32_768, 131_072)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--calls", type=int, nargs="+", default=list(DEFAULT_CALLS))
    parser.add_argument("--tokens", type=int, nargs="+", default=list(DEFAULT_TOKENS))
    parser.add_argument("--repeat", type=int, default=7, help="runs per measurement (median reported)")
    parser.add_argument("--gym-src", help="path of a NeMo Gym checkout: also time its builder + projection")
    parser.add_argument("--tree", action=argparse.BooleanOptionalAction, default=True,
                        help="also time traces mode on a tree (main + 8 sub-agents + 2 compactions) of the largest size")


def synth_snapshot(n_calls: int, n_tokens: int, rollout_id: str = "bench", spans_per_call: int = 0) -> Any:
    """A folded snapshot: ``n_calls`` chained calls whose final sequence is ``n_tokens`` long.

    ``spans_per_call`` > 0: each call's generation carries that many per-token version spans
    (a call that crossed ``spans_per_call - 1`` weight updates).
    """
    from processors.fold import fold
    from processors.replay import MemoryState
    from schemas.hashing import compute_digest
    from schemas.records import CallCaptured, CallFacts, ParentResolution, RolloutEvent, RolloutFinished

    gen = max(1, (n_tokens * 3 // 10) // n_calls)
    first = max(1, n_tokens // 10)
    delta = max(0, (n_tokens - first - gen * n_calls) // max(1, n_calls - 1))
    state = MemoryState()
    cumulative: list[int] = []
    parent: CallCaptured | None = None
    for i in range(n_calls):
        new_prompt = [(31 * (len(cumulative) + k)) % 150_000 for k in range(first if i == 0 else delta)]
        if i == n_calls - 1:  # land exactly on n_tokens
            new_prompt += [7] * max(0, n_tokens - len(cumulative) - len(new_prompt) - gen)
        prompt = cumulative + new_prompt
        generation = [(17 * (len(prompt) + k)) % 150_000 for k in range(gen)]
        full = prompt + generation
        call = CallCaptured(
            model_call_id=f"{i:032x}", created_at=1_700_000_000.0 + i, prompt_token_ids=new_prompt if parent else prompt,
            prompt_is_delta=parent is not None, generation_token_ids=generation,
            generation_log_probs=[-0.001 * ((k % 97) + 1) for k in range(gen)],
            output_items_json='[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"ok"}]},'
                              '{"type":"function_call","call_id":"t","name":"tool","arguments":"{}"}]',
            token_item_index=0, parent_call_id=parent.model_call_id if parent else None,
            parent_resolution=ParentResolution.RESOLVED if parent else ParentResolution.ROOT,
            parent_digest=parent.digest if parent else "", cum_len=len(full), digest=compute_digest(full),
            facts=CallFacts(route="/v1/chat/completions", requested_model="policy", tools_present=True,
                            version_spans=_spans(i, gen, spans_per_call),
                            version_spans_source="engine" if spans_per_call else ""),
        )
        event = RolloutEvent(event_id=f"e{i}", rollout_id=rollout_id, emitted_at=i, source="bench", body=call)
        state.apply(fold(state, event))
        cumulative, parent = full, call
    done = RolloutEvent(event_id="fin", rollout_id=rollout_id, emitted_at=n_calls, source="bench",
                        body=RolloutFinished(result_json='{"reward": 1.0}'))
    return fold(state, done).snapshots[-1]


def _spans(call: int, generated: int, k: int) -> list[Any]:
    from schemas.records import VersionSpan

    if k <= 0:
        return []
    bounds = [generated * j // k for j in range(k + 1)]
    return [VersionSpan(version=f"step-{call + j}", start=bounds[j], end=bounds[j + 1])
            for j in range(k) if bounds[j + 1] > bounds[j]]


def _paired_ms(fn, baseline, repeat: int) -> tuple[float, float, float]:
    """Medians of ``fn`` and ``baseline`` timed alternately, and the median of their per-pair ratios.

    Alternating (and swapping which goes first) exposes both to the same load, so the
    ratio holds on a machine whose speed drifts between seconds.
    """
    fn()
    baseline()  # warm up both
    times: tuple[list[float], list[float]] = ([], [])
    for i in range(max(1, repeat)):
        order = ((fn, times[0]), (baseline, times[1]))
        for run, out in order if i % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            run()
            out.append((time.perf_counter() - start) * 1000)
    ratios = [a / b for a, b in zip(*times)]
    return statistics.median(times[0]), statistics.median(times[1]), statistics.median(ratios)


def _median_ms(fn, repeat: int) -> float:
    fn()  # warm up: the first run pays for page faults of a fresh heap
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main(args: argparse.Namespace) -> int:
    from consumers.rebuild import RebuildRules, rebuild
    from schemas.codec import decode_snapshot, encode_snapshot

    gym = _load_gym(args.gym_src) if args.gym_src else None
    compact, projected = RebuildRules(project_response=False), RebuildRules()
    header = (f"{'calls':>5} {'tokens':>7} {'decode ms':>9} {'compact ms':>10} {'ns/token':>8} "
              f"{'+projection ms':>14} {'ns/token':>8}")
    if gym:
        header += f" {'gym ms':>8} {'gym/+proj':>9} {'gym/compact':>11}"
    print(header)
    worst = None
    budgets: list[str] = []
    for n_calls in args.calls:
        for n_tokens in args.tokens:
            snapshot = synth_snapshot(n_calls, n_tokens)
            blob = encode_snapshot(snapshot)
            decode_ms = _median_ms(lambda blob=blob: decode_snapshot(blob), args.repeat)
            out = rebuild(snapshot, compact)
            if out.mask_sample or out.trajectory is None or len(out.trajectory.token_ids) != n_tokens:
                print(f"benchmark input is wrong: {out.mask_reasons}", file=sys.stderr)
                return 1
            c_ms = _median_ms(lambda snapshot=snapshot: rebuild(snapshot, compact), args.repeat)
            p_ms = _median_ms(lambda snapshot=snapshot: rebuild(snapshot, projected), args.repeat)
            line = (f"{n_calls:>5} {n_tokens:>7} {decode_ms:>9.2f} {c_ms:>10.2f} {c_ms * 1e6 / n_tokens:>8.0f} "
                    f"{p_ms:>14.2f} {p_ms * 1e6 / n_tokens:>8.0f}")
            if gym:
                g_ms = _median_ms(gym(snapshot), max(1, args.repeat // 3))
                line += f" {g_ms:>8.1f} {g_ms / p_ms:>8.1f}x {g_ms / c_ms:>10.0f}x"
            print(line, flush=True)
            if n_calls == max(args.calls) and n_tokens == max(args.tokens):
                text = rebuild(snapshot, projected).response_json or ""
                paired = _paired_ms(lambda snapshot=snapshot: rebuild(snapshot, projected),
                                    lambda text=text: _copy(text), args.repeat)
                worst = (snapshot, len(text), *paired)
    if worst is not None:
        snapshot, size, p_ms, copy_ms, ratio = worst
        shape = (max(args.calls), max(args.tokens))
        at = f"{shape[0]} calls / {shape[1]} tokens"
        if shape == BUDGET_COMPACT_AT:
            # Its own, longer median: a few ms per run, so a burst of load on a shared machine moves it less.
            runs = max(args.repeat, COMPACT_BUDGET_RUNS)
            c_ms = _median_ms(lambda snapshot=snapshot: rebuild(snapshot, compact), runs)
            print(f"budget: {at} to the compact trajectory {c_ms:.2f} ms (median of {runs}) of "
                  f"{BUDGET_COMPACT_MS:g} ms ({_verdict(c_ms, BUDGET_COMPACT_MS)})")
            budgets.append(budget_line("rebuild.compact_ms", c_ms, BUDGET_COMPACT_MS))
        else:
            print(f"budget: the compact budget is set at {BUDGET_COMPACT_AT[0]} calls / {BUDGET_COMPACT_AT[1]} "
                  f"tokens; not judged at {at}")
        print(f"floor: the projection is {size / 1e6:.1f} MB of JSON; one copy of it takes {copy_ms:.2f} ms here "
              f"and the rebuild with the projection {p_ms:.2f} ms (timed alternately): {ratio:.2f}x one copy, "
              f"of {BUDGET_PROJECTION_RATIO:g}x ({_verdict(ratio, BUDGET_PROJECTION_RATIO)})")
        budgets.append(budget_line("rebuild.projection_ratio", ratio, BUDGET_PROJECTION_RATIO, baseline=copy_ms,
                                   ratio=ratio))
    _versions(max(args.calls), max(args.tokens), args.repeat, compact, projected)
    status = 0
    if getattr(args, "tree", False):
        status, tree_budget = _tree(max(args.calls), max(args.tokens), args.repeat)
        budgets += [tree_budget] if tree_budget else []
    for line in budgets:  # last, one per budget: what a table of every benchmark collects
        print(line)
    return status


def _versions(n_calls: int, n_tokens: int, repeat: int, compact: Any, projected: Any) -> None:
    """The cost of per-token versions: every call crossing one weight update (2 spans) against none."""
    from consumers.rebuild import rebuild

    plain, spanned = synth_snapshot(n_calls, n_tokens), synth_snapshot(n_calls, n_tokens, spans_per_call=2)
    out = rebuild(spanned, compact)
    assert not out.mask_sample and out.trajectory is not None
    assert sum(len(s.version_spans) for s in out.trajectory.spans) == 2 * n_calls
    figures = []
    for rules in (compact, projected):
        base = _median_ms(lambda rules=rules: rebuild(plain, rules), repeat)
        with_spans = _median_ms(lambda rules=rules: rebuild(spanned, rules), repeat)
        figures.append(f"{base:.2f} -> {with_spans:.2f} ms ({with_spans / base:.2f}x)")
    print(f"per-token versions, {n_calls} calls / {n_tokens} tokens, 2 spans per call: compact {figures[0]}, "
          f"with the projection {figures[1]}")


def _tree(n_calls: int, n_tokens: int, repeat: int) -> tuple[int, str | None]:
    """Traces mode on the tree against terminal mode on one chain of the same size, and the tree's size.

    Returns the exit status and the tree's ``BUDGET`` line (None when the tree is wrong)."""
    from collections import Counter

    from compose.tools.bench._rebuild_tree import synth_tree_snapshot, unique_tokens
    from consumers.rebuild import RebuildRules, rebuild
    from consumers.rebuild.tree import tree_sizes
    from schemas.records import TraceKind

    tree = synth_tree_snapshot(n_calls, n_tokens)
    chain = synth_snapshot(n_calls, n_tokens)
    traces, projected = RebuildRules(delivery_mode="traces", project_response=False), RebuildRules(delivery_mode="traces")
    out = rebuild(tree, traces)
    kinds = Counter(t.kind for t in out.traces)
    masked = sum(t.mask_sample for t in out.traces)
    if out.mask_sample or masked or (kinds["main"], kinds["subagent"], kinds["compaction"]) != (1, 8, 2):
        print(f"benchmark tree is wrong: traces {dict(kinds)}, {masked} masked, {out.mask_reasons}", file=sys.stderr)
        return 1, None
    single = RebuildRules(project_response=False)
    t_ms, chain_ms, ratio = _paired_ms(lambda: rebuild(tree, traces), lambda: rebuild(chain, single), repeat)
    tp_ms = _median_ms(lambda: rebuild(tree, projected), repeat)
    sizes, unique = tree_sizes(out), unique_tokens(tree)
    at = f"{n_calls} calls / {n_tokens} tokens"
    print(f"tree: {at}, {len(out.traces)} traces: "
          + ", ".join(f"{kinds[k.value]} {k.value}" for k in TraceKind if kinds[k.value]))
    print(f"tree: traces mode {t_ms:.2f} ms, with the projection {tp_ms:.2f} ms; "
          f"one chain of the same size in terminal mode {chain_ms:.2f} ms")
    print(f"budget: {at} traces mode {ratio:.2f}x the single chain (timed alternately), of {BUDGET_TREE_RATIO:g}x "
          f"({_verdict(ratio, BUDGET_TREE_RATIO)})")
    print(f"tree size: the compact tree stores {sizes.stored_tokens} tokens; the snapshot holds {unique} unique "
          f"tokens ({sizes.stored_tokens / unique:.3f}x); written out whole {sizes.expanded_tokens} tokens "
          f"({sizes.expanded_tokens / sizes.stored_tokens:.3f}x the compact tree)")
    return 0, budget_line("rebuild.tree_ratio", ratio, BUDGET_TREE_RATIO, baseline=chain_ms, ratio=ratio)


def _copy(text: str) -> str:
    return "".join((text, "."))  # one copy of the text (a join of one string alone returns it uncopied)


def _verdict(value: float, budget: float) -> str:
    return f"{value / budget:.0%} of budget: {'met' if value <= budget else 'MISSED'}"


def _load_gym(path: str):
    """A factory of timed closures running NeMo Gym's builder + projection + contiguity check on a snapshot.

    Loads ``nemo_gym/token_id_capture/{records,builder}.py`` from a checkout at
    ``path`` on their own (Gym's package ``__init__`` pulls in its server stack).
    Gym reads full-prompt entries from its store; building them is not timed.
    """
    import importlib.util
    import types
    from pathlib import Path

    base = Path(path) / "nemo_gym" / "token_id_capture"
    for name in ("nemo_gym", "nemo_gym.token_id_capture"):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = []
            sys.modules[name] = package

    def load(name: str) -> Any:
        spec = importlib.util.spec_from_file_location(f"nemo_gym.token_id_capture.{name}", base / f"{name}.py")
        assert spec is not None and spec.loader is not None  # a .py file path always has both
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module

    records, builder = load("records"), load("builder")

    def prepare(snapshot: Any):
        entries: list[Any] = []
        cumulative: dict[str, list[int]] = {}
        for sc in snapshot.calls:
            call = sc.call
            base_ids = cumulative.get(call.parent_call_id, []) if call.prompt_is_delta else []
            prompt = base_ids + call.prompt_token_ids
            cumulative[call.model_call_id] = prompt + call.generation_token_ids
            entries.append(records.TokenEntry(
                rollout_id=snapshot.rollout_id, model_call_id=call.model_call_id, model="policy",
                prompt_token_ids=prompt, generation_token_ids=call.generation_token_ids,
                generation_log_probs=call.generation_log_probs, output_items=call.output_items,
                token_item_index=call.token_item_index, created_at=call.created_at,
                parent_call_id=call.parent_call_id, cum_len=call.cum_len, digest=call.digest,
                parent_resolution=call.parent_resolution.value.lower(),
            ))

        def run() -> None:
            out = builder.run_builder(entries)
            response = builder.project_main_chain_response(snapshot.rollout_id, out)
            builder.assert_prefix_contiguity(response)
            if out.notes.chains != 1:
                raise RuntimeError(f"NeMo Gym's builder saw {out.notes.chains} chains")

        return run

    return prepare
