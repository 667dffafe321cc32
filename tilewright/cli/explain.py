"""``tilewright explain``: the candidates for one GEMM and why the winner won."""

from __future__ import annotations

import argparse

from rich.table import Table

from tilewright.cli.common import console


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


def add_parser(sub) -> None:
    e = sub.add_parser("explain", help="show the candidates for one GEMM and why the winner won")
    e.add_argument("M", type=int)
    e.add_argument("N", type=int)
    e.add_argument("K", type=int)
    e.add_argument("--dtype", default="fp32", choices=("fp32", "fp16", "bf16"))
    e.add_argument("--layout-b", default="col", choices=("row", "col"),
                   help="col: B is a transposed weight, as in x @ W.T (default)")
    e.add_argument("--target", default="cpu", help="target name, e.g. cpu, cuda:sm_90a, h200")
    e.set_defaults(fn=cmd_explain)
