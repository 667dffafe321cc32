"""The ``tilewright`` command. Each subcommand parses its arguments and calls library code."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Sequence

from rich.console import Console
from rich.table import Table

# wide enough for the demo's tables when output goes to a file or CI log (rich assumes 80)
console = Console(width=None if sys.stdout.isatty() else 160)


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


# -- demo ----------------------------------------------------------------------------------------
def cmd_demo(args: argparse.Namespace) -> int:
    from tilewright.demo.run import CASES, MODES, run_case
    from tilewright.demo.table import print_results

    cases, modes = _csv(args.cases), _csv(args.modes)
    for c in cases:
        if c not in CASES:
            console.print(f"[red]unknown case {c!r}; choose from {', '.join(CASES)}[/red]")
            return 2
    for m in modes:
        if m not in MODES:
            console.print(f"[red]unknown mode {m!r}; choose from {', '.join(MODES)}[/red]")
            return 2
    results = []
    for case in cases:
        for mode in modes:
            with console.status(f"running {case} ({mode})"):
                results.append(run_case(case, mode))
    print_results(results, console)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": [r.to_json() for r in results]}, f, indent=1)
        console.print(f"wrote {args.json}")
    failed = [r for r in results if not r.passed]
    if failed:
        console.print(f"[red]{len(failed)} of {len(results)} cases failed[/red]")
        return 1
    console.print(f"[green]all {len(results)} cases match eager[/green]")
    return 0


# -- templates, config ---------------------------------------------------------------------------
def cmd_templates(args: argparse.Namespace) -> int:
    from tilewright.templates import manifests

    table = Table(title="registered templates")
    for col in ("backend", "template", "runs on", "parameters", "source hash"):
        table.add_column(col)
    for m in manifests().values():
        for t in m.templates:
            params = ", ".join(f"{k.name}∈{{{','.join(map(str, k.values))}}}" for k in t.space.knobs)
            table.add_row(m.name, t.id, ",".join(m.target_backends), params or "-", t.source_hash)
    console.print(table)
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    from tilewright import config

    table = Table(title="tilewright.config (override with the environment variable)")
    for col in ("setting", "value", "env var", "meaning"):
        table.add_column(col, overflow="fold")
    for name, env, _default, doc in config.describe():
        table.add_row(name, repr(getattr(config, name)), env, doc)
    console.print(table)
    return 0


# -- explain -------------------------------------------------------------------------------------
def cmd_explain(args: argparse.Namespace) -> int:
    from tilewright.autotune import select_gemm
    from tilewright.autotune.cost_model import estimate_gemm, roofline_ms
    from tilewright.kernels.build import default_factory
    from tilewright.problem import GemmProblem
    from tilewright.runtime.targets import get_target

    target = get_target(args.target)
    problem = GemmProblem(M=args.M, N=args.N, K=args.K, dtype=args.dtype, layout_b=args.layout_b,
                          op="mm")
    sel = select_gemm(problem, target, default_factory)
    table = Table(title=f"{problem.describe()} on {target.name} "
                        f"(roofline {roofline_ms(problem, target):.4f} ms)")
    for col in ("rank", "candidate", "predicted ms", "bound", "measured ms", "spread", "status",
                "note"):
        table.add_column(col)
    from tilewright.autotune.policy import policy_for

    cands = sel.results and [r.candidate for r in sel.results] or \
        policy_for("gemm", target).candidates(problem, target)
    records = {r.candidate.key: r.record for r in sel.results}
    for c in sorted(cands, key=lambda c: c.rank):
        est = estimate_gemm(problem, c.param_dict, target) if c.params else None
        rec = records.get(c.key)
        mark = " ◀ winner" if c == sel.winner else ""
        table.add_row(str(c.rank), c.name + mark, f"{c.predicted_ms:.4f}" if c.predicted_ms else "-",
                      est.bound if est else "library", f"{rec.median_ms:.4f}" if rec and rec.median_ms else "-",
                      f"{rec.spread_ms:.4f}" if rec and rec.spread_ms is not None else "-",
                      rec.status if rec else "not run", (rec.reason if rec else "")[:60])
    console.print(table)
    console.print(f"winner: {sel.winner.name} — {sel.reason}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tilewright", description=__doc__)
    p.add_argument("-v", "--verbose", action="store_true", help="log what the tuner decides")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="run real models through the backend and compare with eager")
    d.add_argument("--cases", default="minilm,llama-train,llama-bf16",
                   help="comma-separated: minilm, llama-train, llama-bf16")
    d.add_argument("--modes", default="auto,triton",
                   help="comma-separated: auto (autotuner decides), triton (force generated kernels)")
    d.add_argument("--json", help="also write the results as JSON to this file")
    d.set_defaults(fn=cmd_demo)

    t = sub.add_parser("templates", help="list kernel templates and their parameters")
    t.set_defaults(fn=cmd_templates)
    c = sub.add_parser("config", help="show settings and their environment variables")
    c.set_defaults(fn=cmd_config)

    e = sub.add_parser("explain", help="show the candidates for one GEMM and why the winner won")
    e.add_argument("M", type=int)
    e.add_argument("N", type=int)
    e.add_argument("K", type=int)
    e.add_argument("--dtype", default="fp32", choices=("fp32", "fp16", "bf16"))
    e.add_argument("--layout-b", default="col", choices=("row", "col"),
                   help="col: B is a transposed weight, as in x @ W.T (default)")
    e.add_argument("--target", default="cpu", help="target name, e.g. cpu, cuda:sm_90a, h200")
    e.set_defaults(fn=cmd_explain)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    from tilewright.errors import TilewrightError

    try:
        return args.fn(args)
    except TilewrightError as e:
        console.print(f"[red]error:[/red] {e}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
