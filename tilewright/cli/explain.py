"""``tilewright explain``: the candidates for one GEMM, predicted and measured, and why the
winner won."""

from __future__ import annotations

import argparse

from rich.table import Table

from tilewright.cli.common import console


def cmd_explain(args: argparse.Namespace) -> int:
    from tilewright import config
    from tilewright.autotune.cost_model import estimate_gemm, roofline_ms
    from tilewright.autotune.policy import policy_for
    from tilewright.autotune.select import select_gemm, tied_with_best
    from tilewright.kernels.build import default_factory
    from tilewright.problem import GemmProblem
    from tilewright.runtime.targets import get_target

    target = get_target(args.target)
    problem = GemmProblem(M=args.M, N=args.N, K=args.K, dtype=args.dtype, layout_b=args.layout_b,
                          op="mm")
    from tilewright.cli.cache import open_cache

    cache = open_cache(args)
    with config.patch(isolate=args.isolate):
        sel = select_gemm(problem, target, default_factory, cache=cache)
    _, ties = tied_with_best(sel.results)
    tied = {r.candidate.key for r in ties}
    table = Table(title=f"{problem.describe()} on {target.name} "
                        f"(roofline {roofline_ms(problem, target):.4f} ms)")
    for col in ("rank", "candidate", "predicted ms", "bound", "measured ms", "spread ms", "status",
                "from", "note"):
        table.add_column(col, overflow="fold")
    cands = [r.candidate for r in sel.results] or policy_for("gemm", target).candidates(problem, target)
    by_key = {r.candidate.key: r for r in sel.results}
    for c in sorted(cands, key=lambda c: c.rank):
        est = estimate_gemm(problem, c.param_dict, target) if c.params else None
        res = by_key.get(c.key)
        rec = res.record if res else None
        note = (rec.reason if rec else "") or ""
        if c.key in tied and len(tied) > 1:
            note = ("tied within noise; " + note).rstrip("; ")
        table.add_row(
            str(c.rank), c.name + (" ◀ winner" if c == sel.winner else ""),
            f"{c.predicted_ms:.4f}" if c.predicted_ms else "-", est.bound if est else "library",
            f"{rec.median_ms:.4f}" if rec and rec.median_ms else "-",
            f"{rec.spread_ms:.4f}" if rec and rec.spread_ms is not None else "-",
            rec.status if rec else "not run",
            ("cache" if res.from_cache else "measured") if res else "-", note[:80])
    console.print(table)
    console.print(f"winner: {sel.winner.name} — {sel.reason}")
    if sel.measured:
        console.print("rule: the fastest checked candidate wins; candidates within noise of it "
                      "(2x the larger spread, at least bench_tie_pct % of its time) tie, and a "
                      "tie goes to the lowest policy rank (ATen is rank 0)")
    return 0


def add_parser(sub) -> None:
    e = sub.add_parser("explain", help="show the candidates for one GEMM and why the winner won")
    e.add_argument("M", type=int)
    e.add_argument("N", type=int)
    e.add_argument("K", type=int)
    e.add_argument("--dtype", default="fp32", choices=("fp32", "fp16", "bf16"))
    e.add_argument("--layout-b", default="col", choices=("row", "col"),
                   help="col: B is a transposed weight, as in x @ W.T (default)")
    e.add_argument("--target", default="cpu", help="target name, e.g. cpu, cuda:sm_90a, h200")
    e.add_argument("--cache", help="tuning cache file (default <cache_dir>/autotune/tuning.json)")
    e.add_argument("--isolate", default="auto", choices=("auto", "on", "off"),
                   help="run generated candidates in worker processes")
    e.set_defaults(fn=cmd_explain)
