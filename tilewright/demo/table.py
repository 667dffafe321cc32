"""Rich tables for the demo: one per case and mode, identical GEMMs folded into one row."""

from __future__ import annotations

from collections import OrderedDict

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tilewright.demo.run import CASES, CaseResult


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}" if x < 10 else f"{x:.1f}"


def gemm_table(result: CaseResult) -> Table:
    title = f"{CASES[result.case][0]} — mode {result.mode}"
    table = Table(title=title, title_justify="left", show_lines=False)
    for col, justify in (("graph", "left"), ("GEMM", "left"), ("×", "right"), ("M", "right"),
                         ("N", "right"), ("K", "right"), ("dtype", "left"),
                         ("fused epilogue", "left"), ("tried", "right"), ("winner", "left"),
                         ("ms", "right")):
        table.add_column(col, justify=justify, no_wrap=col in ("winner", "fused epilogue"))
    rows: OrderedDict[tuple, list] = OrderedDict()
    for g in result.graphs:
        for r in g.gemms:
            batch = f"{r.batch}x" if r.op in ("bmm", "baddbmm") else ""
            dtype = r.dtype if r.out_dtype == r.dtype else f"{r.dtype}→{r.out_dtype}"
            key = (g.kind, r.op, batch, r.M, r.N, r.K, dtype, r.epilogue, r.winner)
            if key in rows:
                rows[key][2] += 1
            else:
                rows[key] = [g.kind, f"{batch}{r.op}", 1, str(r.M) + ("*" if "M" in r.dynamic else ""),
                             str(r.N), str(r.K), dtype, r.epilogue, str(r.tried), r.winner, _ms(r.winner_ms)]
    for row in rows.values():
        row[2] = str(row[2])
        table.add_row(*row)
    return table


def grouped_table(result: CaseResult) -> Table:
    """The grouped GEMMs (``tilewright.grouped_mm``) the case ran, per problem and kernel:
    M is the ragged token total at its bucket (2d3d), K for the weight gradients (2d2d)."""
    table = Table(title=f"{CASES[result.case][0]}: grouped GEMMs — mode {result.mode}", title_justify="left")
    for col in ("case", "G", "M", "N", "K", "dtype", "epilogue", "calls", "winner"):
        table.add_column(col, justify="left" if col in ("case", "dtype", "epilogue", "winner") else "right")
    for g in result.grouped:
        table.add_row(g.case, str(g.G), str(g.M), str(g.N), str(g.K), g.dtype, g.epilogue, str(g.calls), g.winner)
    return table


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f}"


def launch_table(result: CaseResult) -> Table:
    """Per graph: tilewright's launches per call (GEMMs + generated kernels + ATen ops), the ATen
    calls one call really makes (profiler-counted: a loop kernel run as PyTorch operators is
    one launch and several calls; the "all" row is the whole model call, eager's beside it),
    Inductor's launches (generated + extern), and the modelled bytes moved beside eager's."""
    table = Table(title=f"{CASES[result.case][0]}: launches per call and modelled traffic",
                  title_justify="left")
    for col in ("graph", "GEMMs", "generated", "ATen", "tilewright", "ATen calls", "Inductor",
                "eager", "MB moved", "eager MB"):
        table.add_column(col, justify="left" if col == "graph" else "right")
    ind = {g.kind: g for g in result.inductor}
    for g in result.graphs:
        i = ind.get(g.kind)
        table.add_row(g.kind, str(g.gemm_nodes), str(g.generated_kernels), str(g.extern_ops), str(g.launches),
                      "-" if g.aten_dispatches is None else str(g.aten_dispatches),
                      f"{i.launches} ({i.kernels}+{i.externs})" if i else "-", str(g.eager_launches),
                      _mb(g.bytes_moved), _mb(g.eager_bytes))
    if len(result.graphs) > 1 or result.dispatches is not None:
        # the whole call: the model's own Python code's ATen calls (outside the graphs) too
        table.add_row("all", "", "", "", str(result.launches),
                      "-" if result.dispatches is None else
                      f"{result.dispatches} (eager {result.eager_dispatches})",
                      str(result.inductor_launches) if result.inductor else "-",
                      str(sum(g.eager_launches for g in result.graphs)),
                      _mb(sum(g.bytes_moved for g in result.graphs)),
                      _mb(sum(g.eager_bytes for g in result.graphs)))
    return table


def summary_table(results: list[CaseResult]) -> Table:
    table = Table(title="tilewright demo: compiled vs eager", title_justify="left")
    for col in ("case", "mode", "dtype", "GEMMs", "grouped", "kernels", "launches", "Inductor",
                "compile+1st run s", "run ms", "max rel err", "bound", "result"):
        table.add_column(col, justify="left" if col in ("case", "mode", "dtype", "result") else "right")
    for r in results:
        gemms = sum(g.gemm_nodes for g in r.graphs)
        kernels = sum(g.generated_kernels for g in r.graphs)
        verdict = Text("PASS", style="green") if r.passed else Text("FAIL", style="red")
        grouped = sum(g.calls for g in r.grouped)
        table.add_row(r.case, r.mode, r.dtype, str(gemms), str(grouped) if grouped else "-", str(kernels), str(r.launches),
                      str(r.inductor_launches) if r.inductor else "-", f"{r.compile_s:.1f}",
                      f"{r.run_ms:.1f}" if r.run_ms else "-", f"{r.max_error:.2e}",
                      f"{r.worst[2]:.2g}" if r.errors else "-", verdict)
    return table


def print_results(results: list[CaseResult], console: Console | None = None) -> None:
    console = console or Console(markup=False)  # case notes and errors are data, not markup
    for r in results:
        console.print(gemm_table(r))
        if r.grouped:
            console.print(grouped_table(r))
        if r.inductor or r.mode == "auto":
            console.print(launch_table(r))
        if r.inductor_error:
            console.print(f"  Inductor failed on this case, so its launches are partial: {r.inductor_error}")
        for k, v in r.errors.items():
            console.print(f"  rel err {k}: {v:.3e} (bound {r.bound(k):.2g})")
        for n in r.notes:
            console.print(f"  {n}")
        for p in r.problems:
            console.print(Text.assemble("  ", ("problem:", "red"), f" {p}"))
        console.print()
    console.print(summary_table(results))
