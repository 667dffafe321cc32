"""Reports for a comparison: a PNG plot of speed-up over ATen per shape (matplotlib) and an HTML
page (jinja2) with the gate's table and the plot embedded. matplotlib is the optional extra
``plot``; without it, ``write_png`` raises a clear error."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import jinja2

from tilewright.errors import TilewrightError
from tilewright.perf.compare import Comparison

_PAGE = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=True).from_string("""\
<!doctype html>
<html><head><meta charset="utf-8"><title>tilewright bench compare</title>
<style>body{font-family:sans-serif;margin:2em}td,th{padding:2px 8px;text-align:right}
td:first-child,th:first-child{text-align:left}.regression{background:#fcc}.improvement{background:#cfc}
.missing,.error{background:#fdb}.noisy{background:#ffc}</style></head><body>
<h1>tilewright: {{ 'PASS' if cmp.passed else 'FAIL' }}</h1>
<p>baseline: {{ cmp.base_env.device }} ({{ cmp.base_env.target }}),
tilewright {{ cmp.base_env.versions.tilewright }},
torch {{ cmp.base_env.versions.torch }}, triton {{ cmp.base_env.versions.triton }}<br>
new: {{ cmp.new_env.device }} ({{ cmp.new_env.target }}), tilewright {{ cmp.new_env.versions.tilewright }},
torch {{ cmp.new_env.versions.torch }}, triton {{ cmp.new_env.versions.triton }}<br>
{{ cmp.rule() }};
{% for v in verdicts %}{{ v }}: {{ cmp.count(v) }} {% endfor %}</p>
{% if png %}<img alt="speed-up over ATen per shape" src="data:image/png;base64,{{ png }}">{% endif %}
{% for which, fraction in cmp.injected.items() %}<p>note: the {{ which }} results were measured
with an injected {{ '%.0f' % (fraction * 100) }}% slowdown of tilewright (a test run)</p>{% endfor %}
<table><tr><th>problem</th><th>metric</th><th>base</th><th>new</th><th>change</th><th>threshold</th>
<th>ms (base → new)</th><th>speed-up vs ATen (base → new)</th><th>choice</th><th>verdict</th></tr>
{% for r in cmp.rows %}<tr class="{{ r.verdict }}"><td>{{ r.id }}</td><td>{{ r.metric or '-' }}</td>
<td>{{ fmt(r.base) }}</td><td>{{ fmt(r.new) }}</td><td>{{ pct(r.change) }}</td>
<td>{{ pct(r.threshold) }} {{ r.threshold_source }}</td><td>{{ fmt(r.base_ms) }} → {{ fmt(r.new_ms) }}</td>
<td>{{ fmt(r.base_speedup) }} → {{ fmt(r.new_speedup) }}</td><td>{{ r.new_choice or r.base_choice }}</td>
<td>{{ r.verdict }}</td></tr>
{% endfor %}</table></body></html>
""")
VERDICTS = ("regression", "improvement", "same", "noisy", "missing", "new", "error")


def png_bytes(cmp: Comparison) -> bytes:
    """A bar chart of tilewright's speed-up over ATen per problem, baseline and new.

    Raises:
        TilewrightError: matplotlib is not installed (``pip install 'tilewright[plot]'``).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise TilewrightError("plots need matplotlib: pip install 'tilewright[plot]'") from None
    rows = [r for r in cmp.rows if r.base_speedup or r.new_speedup]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.35 * len(rows) + 2), 4.5))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r.base_speedup or 0 for r in rows], 0.4, label="baseline")
    ax.bar([x + 0.2 for x in xs], [r.new_speedup or 0 for r in rows], 0.4, label="new",
           color=["#d62728" if r.verdict == "regression" else "#2ca02c" for r in rows])
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(list(xs), [r.id for r in rows], rotation=75, ha="right", fontsize=7)
    ax.set_ylabel("speed-up over ATen (×)")
    ax.set_title(f"tilewright vs ATen on {cmp.new_env.get('device', '?')} ({cmp.new_env.get('target')})")
    ax.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def write_png(cmp: Comparison, path: Path | str) -> None:
    Path(path).write_bytes(png_bytes(cmp))


def write_html(cmp: Comparison, path: Path | str, plot: bool = True) -> None:
    """The comparison as one self-contained HTML page (the plot embedded when ``plot``)."""
    png = base64.b64encode(png_bytes(cmp)).decode() if plot else ""

    def fmt(x):
        return "-" if x is None else f"{x:.4g}"

    def pct(x):
        return "-" if x is None else f"{x * 100:+.1f}%"

    Path(path).write_text(_PAGE.render(cmp=cmp, png=png, fmt=fmt, pct=pct, verdicts=VERDICTS))
