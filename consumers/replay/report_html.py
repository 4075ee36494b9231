"""A self-contained HTML report of a batch replay: tables and a chart of mask reasons over time.

One file, no scripts, no external assets (it is read on machines without a
network): an inline SVG stacked-bar chart, one bar per time bucket, stacked by
each rollout's primary mask reason (delivered rollouts in grey); a table of
traces per kind when the summary counted traces, and of policy staleness when
it read the versions topic.
"""

from __future__ import annotations

import html
from datetime import UTC, datetime
from typing import Any

_PALETTE = ["#d62728", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#1f77b4", "#2ca02c"]
_DELIVERED = "#c7c7c7"


def render_html(data: dict[str, Any], *, buckets: int = 24, title: str = "tokentrail mask report") -> str:
    reasons = list(data["by_reason"])
    colors = {r: _PALETTE[i % len(_PALETTE)] for i, r in enumerate(reasons)}
    chart = _chart(data["timeline"], reasons, colors, buckets)
    legend = "".join(f'<span class="key"><i style="background:{colors[r]}"></i>{html.escape(r)}</span>'
                     for r in reasons) + f'<span class="key"><i style="background:{_DELIVERED}"></i>delivered</span>'
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body{{font:14px system-ui,sans-serif;margin:2em;color:#222}} table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ddd;padding:4px 8px;text-align:left}} th{{background:#f4f4f4}}
.key{{margin-right:1em;white-space:nowrap}} .key i{{display:inline-block;width:12px;height:12px;margin-right:4px}}
</style></head><body>
<h1>{html.escape(title)}</h1>
<p>{data['rollouts']} rollouts finished in range, {data['masked']} masked ({data['masked_fraction']:.1%}),
{data['events_scanned']} events scanned; range {_when(data['since_ms'])} to {_when(data['until_ms'])}.</p>
<h2>Mask reasons over time</h2>
<div>{legend}</div>
{chart}
<h2>Mask reasons</h2>
{_table(["reason", "rollouts"], [[r, n] for r, n in data["by_reason"].items()])}
<h2>By harness (user agent)</h2>
{_table(["harness", "rollouts", "masked", "masked %", "reasons"], _rows(data["by_harness"]))}
<h2>By model (requested)</h2>
{_table(["model", "rollouts", "masked", "masked %", "reasons"], _rows(data["by_model"]))}
<h2>Costliest masked rollouts</h2>
{_table(["rollout", "generated tokens", "calls", "reasons"],
        [[r["rollout_id"], r["generated_tokens"], r["n_calls"], ", ".join(r["reasons"])] for r in data["top_masked"]])}
{_traces(data)}
{_staleness(data)}
<p>Explain one: <code>tokentrail replay --bootstrap HOST:PORT --rollout ID</code></p>
</body></html>
"""


def _chart(timeline: list[dict[str, Any]], reasons: list[str], colors: dict[str, str], buckets: int) -> str:
    if not timeline:
        return "<p>(no rollouts in range)</p>"
    start, end = timeline[0]["finished_ms"], timeline[-1]["finished_ms"]
    width_ms = max(end - start, 1) / buckets
    counts = [dict.fromkeys([*reasons, "delivered"], 0) for _ in range(buckets)]
    for row in timeline:
        index = min(int((row["finished_ms"] - start) / width_ms), buckets - 1)
        counts[index][row["reasons"][0] if row["masked"] and row["reasons"] else "delivered"] += 1
    tallest = max(sum(c.values()) for c in counts) or 1
    w, h, pad = 720, 240, 30
    bar = (w - pad) / buckets
    parts = [f'<svg width="{w}" height="{h + 40}" role="img" aria-label="mask reasons over time">']
    for i, c in enumerate(counts):
        y: float = h
        for name in ["delivered", *reasons]:
            n = c[name]
            if not n:
                continue
            height = n / tallest * (h - 10)
            y -= height
            color = _DELIVERED if name == "delivered" else colors[name]
            parts.append(f'<rect x="{pad + i * bar:.1f}" y="{y:.1f}" width="{bar * 0.85:.1f}" height="{height:.1f}" '
                         f'fill="{color}"><title>{html.escape(name)}: {n}</title></rect>')
    parts.append(f'<line x1="{pad}" y1="{h}" x2="{w}" y2="{h}" stroke="#999"/>')
    parts.append(f'<text x="0" y="12" font-size="11">{tallest}</text>')
    parts.append(f'<text x="{pad}" y="{h + 16}" font-size="11">{_when(start)}</text>')
    parts.append(f'<text x="{w}" y="{h + 16}" font-size="11" text-anchor="end">{_when(end)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _traces(data: dict[str, Any]) -> str:
    """The per-kind trace table, only when the summary's rules delivered traces."""
    if "traces" not in data:
        return ""
    t = data["traces"]
    rows = [[kind, e["traces"], e["masked"]] for kind, e in t["by_kind"].items()]
    return (f"<h2>Traces (delivery_mode traces)</h2>\n<p>{t['traces']} traces, {t['masked']} masked, "
            f"in {t['rollouts_with_masked_traces']} rollout(s) with masked traces.</p>\n"
            + _table(["kind", "traces", "masked"], rows))


def _staleness(data: dict[str, Any]) -> str:
    """The policy-staleness histogram, only when the summary read announcements (the versions topic)."""
    if "staleness" not in data:
        return ""
    st = data["staleness"]
    bound = "" if st["max_staleness"] is None else f", {st['stale']} beyond max_staleness={st['max_staleness']}"
    return (f"<h2>Policy staleness at freeze</h2>\n<p>Versions behind the current one: {st['rollouts_judged']} "
            f"rollouts judged, {st['unknown']} unknown{html.escape(bound)}.</p>\n"
            + _table(["versions behind", "rollouts"], [[k, n] for k, n in st["histogram"].items()]))


def _rows(breakdown: dict[str, dict[str, Any]]) -> list[list[Any]]:
    return [[name, e["rollouts"], e["masked"], f"{e['masked_fraction']:.1%}",
             ", ".join(f"{r} x{n}" for r, n in e["reasons"].items())] for name, e in breakdown.items()]


def _table(header: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body or '<tr><td colspan=9>none</td></tr>'}</table>"


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
