"""``tilewright aot``: build a model's kernels for other chips, with instruction checks."""

from __future__ import annotations

import argparse
import re

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from tilewright.cli.common import console, positive_float, positive_int, target_list

DEFAULT_TARGETS = "sm_90a,sm_100a,gfx950,gfx1250"


def _short(pattern: str) -> str:
    """A promised-instruction pattern as its leading literal ("ld.global", "tensor_load_to_lds")."""
    text = re.sub(r"\(\?m\)|\^|\\[bSswWdD]", "", pattern)
    text = re.sub(r"\((\w+)\|[^)]*\)", r"\1", text).replace("\\", "")  # (global|buffer) -> global
    return re.split(r'[(\["*]', text, maxsplit=1)[0].strip() or pattern


def cmd_aot(args: argparse.Namespace) -> int:
    from tilewright.compiler import aot

    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), TextColumn("{task.fields[last]}", markup=False), console=console)
    with progress:
        task = progress.add_task("lowering", total=None, last="")

        def planned(n: int) -> None:
            progress.update(task, description="compiling", total=n)

        def landed(result) -> None:
            progress.update(task, advance=1, last=f"{result.status:7s} {result.name}")

        report = aot.build(args.model, args.target, args.out, train=args.train,
                           per_template=args.per_template, workers=args.jobs,
                           timeout_s=args.timeout, check=args.verify,
                           on_planned=planned, on_result=landed)
    table = Table(title=f"{report.model}: {len(report.kernels)} kernels → {report.out_dir}/manifest.json")
    for col in ("target", "kernel", "template", "tile", "pred. ms", "bound", "build", "s", "check"):
        table.add_column(col, overflow="fold")
    for k in report.kernels:
        tile = aot.describe_params(k.params, k.template)
        status = k.result.status if k.result else "-"
        color = "green" if k.result and k.result.ok else "red"
        if k.dropped is not None:
            status, color = "dropped", "yellow"
        if k.verified is None:
            check = "-"
        elif k.verified:
            check = Text.assemble(("ok ", "green"), " ".join(f"{_short(pat)}×{n}"
                                                             for pat, n in k.verify_counts.items()))
        else:
            check = Text("; ".join(k.verify_failures), style="red")
        table.add_row(k.target.name, aot.describe_problem(k.captured.problem), k.template.id,
                      tile, f"{k.predicted_ms:.4f}", k.bound, Text(status, style=color),
                      f"{k.result.seconds:.1f}" if k.result else "-", check)
    console.print(table)
    for k in report.failed:
        console.print(Text.assemble((f"{k.name}: {k.result.status if k.result else 'not built'} ", "red"),
                                    (k.result.error if k.result else "").strip()[-600:]))
    for k in report.dropped:
        console.print(f"{k.name}: left out ({k.dropped})", style="yellow")
    if report.refused:
        console.print(f"{len(report.refused)} (template, target, problem) pairs refused before "
                      "compiling; reasons in manifest.json")
    if uncovered := report.uncovered:
        console.print(f"{len(uncovered)} problems got no kernel on some target (they run on ATen there):",
                      style="yellow")
        for r in uncovered[:5]:
            why = "; ".join(f"{t}: {reason}" for t, reason in r["reasons"].items())
            console.print(f"  {r['target']}: {r['problem']}: {why}", style="yellow")
        if len(uncovered) > 5:
            console.print(f"  ... and {len(uncovered) - 5} more in manifest.json", style="yellow")
    if not report.ok:
        console.print(f"{len(report.failed)} kernels failed to build, "
                      f"{len(report.verify_failed)} failed their instruction checks", style="red")
        return 1
    kinds = [k.kind for k in report.kernels if k.dropped is None]
    by_kind = ", ".join(f"{kinds.count(kind)} {kind}" for kind in dict.fromkeys(kinds))
    # Metal kernels have no instruction check: their build is the host syntax check
    verified = args.verify and any(k.verified is not None for k in report.kernels)
    built = len(report.kernels) - len(report.dropped)
    console.print(f"all {built} kernels built"
                  f"{' and passed their instruction checks' if verified else ''} ({by_kind})"
                  f"{f'; {len(report.dropped)} failed candidates replaced' if report.dropped else ''}", style="green")
    return 0


def add_parser(sub) -> None:
    a = sub.add_parser("aot", help="build a model's kernels ahead of time for other GPUs")
    a.add_argument("model", help="package.module:callable returning (model, example_inputs), "
                                 "or a torch.export .pt2 file; e.g. tilewright.demo.models:llama_example")
    a.add_argument("--target", type=target_list, default=DEFAULT_TARGETS,
                   help=f"comma-separated targets (default {DEFAULT_TARGETS}); see `tilewright targets`")
    a.add_argument("--out", default="aot-build", help="output folder (default ./aot-build)")
    a.add_argument("--train", action="store_true", help="also build the backward graph's kernels")
    a.add_argument("--per-template", type=positive_int, default=1,
                   help="best-ranked settings built per template and problem (default 1)")
    a.add_argument("--jobs", type=positive_int, default=2, help="compile processes at once (default 2)")
    a.add_argument("--timeout", type=positive_float, default=600.0, help="seconds before a compile is killed")
    a.add_argument("--verify", action=argparse.BooleanOptionalAction, default=True,
                   help="check each kernel's instructions against its template's promise (default on)")
    a.set_defaults(fn=cmd_aot)
