"""``tilewright explain``: the candidates for one kernel problem, predicted and measured, and
why the winner won.

A problem of any kind the autotuner selects for (a GEMM, a loop kernel, a grouped GEMM, and
each kind registered later) comes from one of three places: ``M N K`` (a GEMM; with ``--dtype
mxfp4|mxfp8`` an MX block-scaled one, with ``--groups G`` the MoE grouped GEMM), ``--problem``
(a problem's JSON, or a debug dump's ``kernels/<name>_selection.json``, which holds one), or
``--model`` (the kernels ``tilewright`` would make for a model: listed, or explained with
``--kernel``). Nothing here knows a kind: candidates come from ``policy_for``, estimates from
the cost model's per-kind entry, the choice from ``select``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.table import Table

from tilewright.cli.common import console


def _dumped_template_ids(path: str) -> list[str]:
    """The template ids of a debug dump's candidates (a *_selection.json), else []."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return []
    cands = data.get("candidates") if isinstance(data, dict) else None
    return sorted({c["name"].split("[", 1)[0] for c in cands or () if isinstance(c, dict) and "name" in c})


def missing_templates_note(problem: Any, target: Any, dumped: list[str]) -> str | None:
    """What to say when this process may lack the user's templates: the dump's candidates whose
    templates are not registered here, or, when only ATen serves the problem and nothing was
    loaded with --templates/TILEWRIGHT_TEMPLATES, that templates registered by calls in
    another process are not seen in this one. None when neither holds."""
    from tilewright.autotune.kinds import kind_name
    from tilewright.autotune.policy import policy_for
    from tilewright.templates import all_templates, is_builtin, user_modules_loaded

    fix = ("load the module or file that registers them: tilewright explain --templates MODULE_OR_FILE "
           "(or TILEWRIGHT_TEMPLATES=MODULE_OR_FILE; entry points are loaded already)")
    known = {t.id for t in all_templates()}
    missing = [t for t in dumped if t not in known]
    if missing:
        return f"the dump's candidates {', '.join(missing)} are not registered in this process: {fix}"
    if user_modules_loaded():
        return None
    cands = policy_for(kind_name(problem), target).candidates(problem, target)
    if all(is_builtin(c.template_id) for c in cands):
        return ("only tilewright's own templates are candidates here; templates your own code registers by calls "
                f"(register_template, helion_template) are not in a new process: {fix}")
    return None


def _problem_from_file(path: str) -> Any:
    from tilewright.autotune.kinds import problem_from_json
    from tilewright.errors import InvalidInputError

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise InvalidInputError(f"--problem {path}: cannot read a JSON problem ({e})") from e
    if isinstance(data, dict) and isinstance(data.get("problem"), dict):
        data = data["problem"]  # a debug dump's <name>_selection.json
    try:
        return problem_from_json(data)
    except Exception as e:  # noqa: BLE001 - any way it fails to parse is the same user error
        raise InvalidInputError(f"--problem {path}: not a problem's JSON ({type(e).__name__}: {e}); "
                                "give a problem's to_json() or a debug dump's *_selection.json") from e


def _estimate(problem: Any, candidate: Any, target: Any) -> Any:
    """The cost model's estimate of one candidate (None for library calls and on failure)."""
    from tilewright.autotune.kinds import kind_name
    from tilewright.compiler.aot_written import estimate
    from tilewright.templates import get_template

    if not candidate.params or candidate.backend == "aten":
        return None
    try:
        return estimate(kind_name(problem), problem, candidate.param_dict, target, get_template(candidate.template_id))
    except Exception:  # noqa: BLE001 - a kind without an estimate: the policy's prediction stands
        return None


def explain_problem(problem: Any, target: Any, cache: Any) -> None:
    """Select a kernel for ``problem`` on ``target`` (measuring what the cache lacks) and print
    every candidate: rank, prediction, bound, measurement, status and the winner's reason."""
    from tilewright.autotune.kinds import kind_name
    from tilewright.autotune.policy import policy_for
    from tilewright.autotune.select import select, tied_with_best
    from tilewright.compiler.kernel_factory import default_factory

    sel = select(problem, target, default_factory, cache=cache)
    _, ties = tied_with_best(sel.results)
    tied = {r.candidate.key for r in ties}
    title = f"{kind_name(problem)}: {problem.describe()} on {target.name}"
    if kind_name(problem) == "gemm":
        from tilewright.kinds.gemm.cost import roofline_ms

        title += f" (roofline {roofline_ms(problem, target):.4f} ms)"
    table = Table(title=title)
    for col in ("rank", "candidate", "predicted ms", "bound", "measured ms", "spread ms", "status",
                "from", "note"):
        table.add_column(col, overflow="fold")
    cands = [r.candidate for r in sel.results] or policy_for(kind_name(problem), target).candidates(problem, target)
    by_key = {r.candidate.key: r for r in sel.results}
    for c in sorted(cands, key=lambda c: c.rank):
        est = _estimate(problem, c, target)
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


def _model_kernels(args: argparse.Namespace, target: Any = None) -> list[Any]:
    from tilewright.compiler.capture import capture_kernels, load_model

    # fused as the compiled model on ``target`` fuses them (a CPU's GEMMs keep no epilogue)
    return capture_kernels(load_model(args.model), train=args.train, target=target)


def _list_kernels(kernels: list[Any]) -> None:
    from tilewright.autotune.kinds import kind_name

    table = Table(title="kernels (explain one with --kernel NUMBER, or --kernel all)")
    for col in ("#", "kind", "problem", "uses"):
        table.add_column(col, overflow="fold")
    for i, k in enumerate(kernels):
        uses = ", ".join(k.uses[:3]) + (f" (+{len(k.uses) - 3})" if len(k.uses) > 3 else "")
        table.add_row(str(i), kind_name(k.problem), k.problem.describe(), uses)
    console.print(table)


def cmd_explain(args: argparse.Namespace) -> int:
    from tilewright import config
    from tilewright.cli.cache import open_cache
    from tilewright.errors import InvalidInputError
    from tilewright.runtime.targets import get_target

    if args.templates:
        from tilewright.templates import load_user_modules

        load_user_modules(args.templates)
    given = [args.M is not None, args.problem is not None, args.model is not None]
    if sum(given) != 1 or (args.M is not None and (args.N is None or args.K is None)):
        raise InvalidInputError("explain takes one problem: M N K (a GEMM), --problem FILE.json, "
                                "or --model package.module:fn (with --kernel to pick one)")
    target = get_target(args.target)
    if args.model is not None:
        kernels = _model_kernels(args, target)
        if args.kernel is None:
            _list_kernels(kernels)
            return 0
        if args.kernel == "all":
            problems = [k.problem for k in kernels]
        elif args.kernel.isdigit() and int(args.kernel) < len(kernels):
            problems = [kernels[int(args.kernel)].problem]
        else:
            raise InvalidInputError(f"--kernel {args.kernel}: give a number below {len(kernels)} "
                                    "(run without --kernel to list them) or 'all'")
    elif args.problem is not None:
        problems = [_problem_from_file(args.problem)]
    else:
        problems = [_sized_problem(args)]
    cache = open_cache(args)
    dumped = _dumped_template_ids(args.problem) if args.problem is not None else []
    with config.patch(isolate=args.isolate):
        for problem in problems:
            explain_problem(problem, target, cache)
            note = missing_templates_note(problem, target, dumped)
            if note:
                console.print(f"note: {note}")
    return 0


def _sized_problem(args: argparse.Namespace) -> Any:
    """The problem ``M N K`` describes: a GEMM (block-scaled MX operands, E8M0 scales per 32
    values row-major and a bf16 output, for ``--dtype mxfp4|mxfp8``), or with ``--groups G``
    the MoE forward grouped GEMM (2d3d: M tokens over G experts, each expert's weight (N, K) as
    nn.Linear stores it, for ``--layout-b col``).

    Raises:
        InvalidInputError: ``--groups`` with an MX dtype, or a group count below 1.
    """
    from tilewright.errors import InvalidInputError
    from tilewright.kinds.gemm.problem import GemmProblem

    if args.groups is not None:
        from tilewright.kinds.grouped_gemm.problem import GroupedGemmProblem

        if args.groups < 1:
            raise InvalidInputError(f"--groups {args.groups}: give the number of experts (at least 1)")
        if args.dtype not in ("fp32", "fp16", "bf16"):
            raise InvalidInputError(f"--groups takes --dtype fp32, fp16 or bf16, not {args.dtype}")
        return GroupedGemmProblem(case="2d3d", G=args.groups, M=args.M, N=args.N, K=args.K, dtype=args.dtype,
                                  layout_b=args.layout_b)
    if args.dtype in ("mxfp4", "mxfp8"):
        return GemmProblem(M=args.M, N=args.N, K=args.K, dtype=args.dtype, out_dtype="bf16", layout_b="col",
                           scale_layout="row", op="mx_mm")
    return GemmProblem(M=args.M, N=args.N, K=args.K, dtype=args.dtype, layout_b=args.layout_b, op="mm")


def add_parser(sub) -> None:
    e = sub.add_parser("explain", help="show the candidates for one kernel (a GEMM, a loop kernel, a grouped "
                                       "GEMM ...) and why the winner won",
                       description="Explain a GEMM (M N K; --dtype mxfp4/mxfp8 for an MX one, --groups G for a "
                                   "grouped MoE one), a problem from JSON (--problem, e.g. a "
                                   "TILEWRIGHT_DEBUG_DIR dump's kernels/<name>_selection.json), or the "
                                   "kernels of a model (--model; --kernel N or all).")
    e.add_argument("M", type=int, nargs="?")
    e.add_argument("N", type=int, nargs="?")
    e.add_argument("K", type=int, nargs="?")
    e.add_argument("--dtype", default="fp32", choices=("fp32", "fp16", "bf16", "mxfp4", "mxfp8"),
                   help="with M N K: the operand type; mxfp4/mxfp8: block-scaled operands (E8M0 "
                        "scales per 32, row-major), bf16 out")
    e.add_argument("--groups", type=int,
                   help="with M N K: a grouped GEMM (MoE forward, 2d3d): M tokens over this many experts")
    e.add_argument("--layout-b", default="col", choices=("row", "col"),
                   help="col: B is a transposed weight, as in x @ W.T (default)")
    e.add_argument("--problem", help="a problem's JSON file (any kind), or a debug dump's *_selection.json")
    e.add_argument("--model", help="package.module:fn returning (model, example_inputs), or a .pt2 file")
    e.add_argument("--kernel", help="with --model: the kernel's number in the list, or 'all'")
    e.add_argument("--train", action="store_true", help="with --model: the training graphs")
    e.add_argument("--target", default="cpu", help="target name, e.g. cpu, cuda:sm_90a, h200")
    e.add_argument("--templates", action="append", default=[], metavar="MODULE_OR_FILE",
                   help="a module (mypkg.kernels) or .py file registering your own templates (its register() "
                        "is called when it has one); repeatable; TILEWRIGHT_TEMPLATES does the same for "
                        "every process")
    e.add_argument("--cache", help="tuning cache file (default <cache_dir>/autotune/tuning.json)")
    e.add_argument("--isolate", default="auto", choices=("auto", "on", "off"),
                   help="run generated candidates in worker processes")
    e.set_defaults(fn=cmd_explain)
