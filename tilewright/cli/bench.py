"""``tilewright bench run / compare / show``: the performance gate."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.table import Table
from rich.text import Text

from tilewright.cli.common import console


def _f(x, spec: str = ".4g") -> str:
    return "-" if x is None else format(x, spec)


def results_table(doc: dict) -> Table:
    """One row per problem of a results document."""
    env = doc["env"]
    table = Table(title=f"suite {doc['suite']} on {env['device']} ({env['target']}), "
                        f"torch {env['versions']['torch']} triton {env['versions']['triton']}")
    for col in ("problem", "choice", "tilewright ms", "±", "TFLOP/s", "GB/s", "ATen ms",
                "speed-up", "inductor ms"):
        table.add_column(col, overflow="fold")
    for r in doc["results"]:
        tw, at, ind = (r.get("impls", {}).get(k, {}) for k in ("tilewright", "aten", "inductor"))
        table.add_row(r["id"], r.get("choice", r.get("error", "-"))[:40], _f(tw.get("ms")),
                      _f(tw.get("spread_ms"), ".2g"), _f(tw.get("tflops"), ".1f"),
                      _f(tw.get("gbps"), ".0f"), _f(at.get("ms")),
                      _f(r.get("speedup_vs_aten"), ".2f"), _f(ind.get("ms")) if ind else "-")
    return table


def cmd_run(args: argparse.Namespace) -> int:
    from tilewright.cli.warm import load_factory
    from tilewright.perf.run import run_suite
    from tilewright.perf.suites import suite_problems
    from tilewright.runtime.targets import detect_target, get_target

    problems = suite_problems(args.suite, args.shapes)
    if args.target:
        target = get_target(args.target)
    else:
        import torch

        target = detect_target("cuda" if torch.cuda.is_available() else "cpu")
    with console.status(f"bench {args.suite} ({len(problems)} problems) on {target.name}") as status:
        doc = run_suite(args.suite, problems, target, load_factory(args.factory),
                        inductor=args.inductor, time_budget_s=args.time_budget_s,
                        out=Path(args.out), on_progress=lambda name, row: status.update(f"done {name}"))
    console.print(results_table(doc))
    lo = doc.get("launch_overhead_us")
    if lo:
        console.print(f"wrapper cost per kernel call (null kernel): {lo['static']:.2f} µs static, "
                      f"{lo['dynamic']:.2f} µs with bucket dispatch (a plain Python call: "
                      f"{lo['python_call']:.2f} µs; Inductor's launcher: ~{lo['inductor_reference']:.0f} µs)")
    if doc["skipped"]:
        console.print(f"{len(doc['skipped'])} problems skipped: time budget spent", style="yellow")
    console.print(f"wrote {args.out}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from tilewright.perf.compare import load_results

    console.print(results_table(load_results(args.results)))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from tilewright.perf.compare import compare, load_results, parse_percent
    from tilewright.perf.report import write_html, write_png

    new = load_results(args.new)
    base = load_results(args.base, suite=new.get("suite"), arch=new["env"].get("arch"))
    cmp = compare(base, new, parse_percent(args.max_regression), allow_missing=args.allow_missing)
    table = Table(title=f"tilewright bench compare (max regression {cmp.max_regression:.1%} beyond noise)")
    for col in ("problem", "base ms", "new ms", "change", "noise", "speed-up vs ATen", "verdict"):
        table.add_column(col, overflow="fold")
    style = {"regression": "red", "missing": "red", "error": "red", "improvement": "green"}
    for r in cmp.rows:
        table.add_row(r.id, _f(r.base_ms), _f(r.new_ms),
                      "-" if r.change is None else f"{r.change:+.1%}",
                      "-" if r.noise is None else f"{r.noise:.1%}",
                      f"{_f(r.base_speedup, '.2f')} → {_f(r.new_speedup, '.2f')}",
                      Text(r.verdict, style=style.get(r.verdict, "")))  # the console prints no markup
    console.print(table)
    if args.png:
        write_png(cmp, args.png)
        console.print(f"wrote {args.png}")
    if args.html:
        write_html(cmp, args.html)
        console.print(f"wrote {args.html}")
    counts = ", ".join(f"{v} {cmp.count(v)}"
                       for v in ("regression", "error", "missing", "improvement", "same", "noisy"))
    gm = cmp.geomean_speedup("new")
    console.print(f"{'PASS' if cmp.passed else 'FAIL'}: {counts}; geomean speed-up vs ATen "
                  f"{_f(gm, '.3f')}")
    return 0 if cmp.passed else 1


def add_parser(sub) -> None:
    b = sub.add_parser("bench", help="benchmark suites and the perf-regression gate")
    bsub = b.add_subparsers(dest="bench_command", required=True)
    r = bsub.add_parser("run", help="time tilewright's choice vs ATen per problem of a suite")
    r.add_argument("--suite", required=True, help="tiny, llm-decode, llm-prefill, llm, h200-check")
    r.add_argument("--out", required=True, help="results JSON (rewritten after every problem)")
    r.add_argument("--target", help="default: this machine's GPU, else cpu")
    r.add_argument("--shapes", help="shapes file for the llm suites (default bench/cases/...)")
    r.add_argument("--inductor", action="store_true", help="also time Inductor max-autotune")
    r.add_argument("--time-budget-s", type=float, help="start no new problem after this long")
    r.add_argument("--factory", help=argparse.SUPPRESS)
    r.set_defaults(fn=cmd_run)
    c = bsub.add_parser("compare", help="fail on a regression beyond noise (exit code 1)")
    c.add_argument("base", help="baseline results file, or a folder like bench/baselines")
    c.add_argument("new", help="new results file")
    c.add_argument("--max-regression", default="3%", help="e.g. 3%% (default)")
    c.add_argument("--allow-missing", action="store_true", help="problems missing from NEW pass")
    c.add_argument("--html", help="write an HTML report with the plot")
    c.add_argument("--png", help="write the speed-up plot")
    c.set_defaults(fn=cmd_compare)
    s = bsub.add_parser("show", help="print a results file as a table")
    s.add_argument("results")
    s.set_defaults(fn=cmd_show)
