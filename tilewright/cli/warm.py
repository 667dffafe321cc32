"""``tilewright warm``: tune a shapes file or a model's GEMMs ahead of time, resumably."""

from __future__ import annotations

import argparse
import importlib
import json

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tilewright.cli.common import console, csv, positive_int


def load_factory(spec: str | None):
    """The kernel factory: the installed templates', or ``module:attr`` (an object or a
    zero-argument callable returning one; for simulated devices and plugins)."""
    if not spec:
        from tilewright.compiler.kernel_factory import default_factory

        return default_factory
    from tilewright.errors import ConfigError

    mod, _, attr = spec.partition(":")
    try:
        obj = getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise ConfigError(f"--factory {spec}: {e}; write module:attr") from None
    return obj() if callable(obj) and not hasattr(obj, "build") else obj


def _m_values(text: str) -> list[int]:
    values = [positive_int(m) for m in csv(text)]
    if not values:
        raise argparse.ArgumentTypeError("no M value given")
    return values


def _dims(text: str) -> list[str]:
    dims = csv(text)
    bad = [d for d in dims if d not in ("M", "N", "K")]
    if bad:
        raise argparse.ArgumentTypeError(f"dynamic dims must be among M, N, K, not {', '.join(bad)}")
    return dims


def gather_problems(args: argparse.Namespace):
    """NamedProblems from a shapes file or a ``module:callable`` model spec."""
    from pathlib import Path

    from tilewright.autotune.shapes import NamedProblem
    from tilewright.kinds.gemm.shapes import load_shapes, problems_from_shapes

    if ":" in args.shapes and not Path(args.shapes).exists():
        from tilewright.compiler.capture import capture_kernels, load_model
        from tilewright.kinds import kind_of

        name = args.shapes.split(":")[-1]
        out = []
        from tilewright.runtime.targets import get_target

        target = get_target(getattr(args, "target", "cpu"))  # its compiled models' problems (their fusion)
        for i, c in enumerate(capture_kernels(load_model(args.shapes), train=args.train, target=target)):
            # each at the sizes the compiled model looks up (a loop kernel's bucket), as its kind says
            for suffix, p in kind_of(c.problem).warm_problems(c.problem):
                out.append(NamedProblem(f"{name}.{i}.{suffix}", p))
        return out
    data = load_shapes(args.shapes)
    return problems_from_shapes(
        data, models=csv(args.models) if args.models else None,
        phases=csv(args.phases), m_values=args.m, dtype=args.dtype, dynamic=args.dynamic or (),
        bias=args.bias)


def cmd_warm(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tilewright.autotune.warm import expand_buckets, warm
    from tilewright.cli.cache import open_cache
    from tilewright.runtime.targets import get_target

    target = get_target(args.target)
    problems = expand_buckets(gather_problems(args), args.max_m)
    cache = open_cache(args)
    if args.json:  # refused now, not after an hour of tuning
        from tilewright.autotune.files import check_replaceable
        from tilewright.autotune.warm import WarmReport

        check_replaceable(Path(args.json), WarmReport.is_report, "a warm report")
    factory = load_factory(args.factory)
    if args.ray is None:
        from tilewright.autotune.select import local_devices
        from tilewright.autotune.warm import WarmError

        if not local_devices(target):
            raise WarmError(f"target {target.name} is not on this machine, so nothing can be "
                            f"measured here; run the warmer where it is, or on a fleet with --ray")
    console.print(f"warming {len(problems)} problems for {target.name} into {cache.path}")
    with Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=False) as progress:
        bar = progress.add_task("tuning", total=len(problems))

        def tick(name: str, status: str) -> None:
            progress.update(bar, advance=1, description=f"{status}: {name}")

        report = warm(problems, target, factory, cache=cache,
                      state_path=Path(args.state) if args.state else None, restart=args.restart,
                      use_ray=args.ray is not None, ray_address=args.ray or None,
                      on_progress=tick)
        progress.update(bar, completed=report.skipped + report.tuned + len(report.failed))
    console.print(f"{report.tuned} tuned, {report.skipped} already done (state {report.state_path}), "
                  f"{len(report.failed)} failed; {report.measured} candidates benchmarked "
                  f"in {report.seconds:.1f} s")
    for name, why in report.failed.items():
        console.print(f"failed {name}: {why}", style="red")
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_json(), indent=1))
    return 1 if report.failed else 0


def add_parser(sub) -> None:
    w = sub.add_parser("warm", help="tune a shapes file or a model's GEMMs ahead of time (resumable)")
    w.add_argument("shapes", help="a shapes JSON file (like bench/cases/llm_gemm_shapes.json) or a "
                                  "model spec module:callable returning (model, example_inputs)")
    w.add_argument("--target", default="cpu", help="target to tune for (must be this machine's)")
    w.add_argument("--models", help="comma-separated models of the shapes file (default all)")
    w.add_argument("--phases", default="decode,prefill", help="decode and/or prefill M lists")
    w.add_argument("--m", type=_m_values, help="comma-separated M values instead of the file's lists")
    w.add_argument("--dtype", default="bf16", help="fp32, fp16 or bf16 (shapes files)")
    w.add_argument("--dynamic", type=_dims, help="dims to mark dynamic, e.g. M: keys then match a model "
                                     "compiled with dynamic shapes")
    w.add_argument("--bias", action="store_true",
                   help="shapes files: the layers have a bias (nn.Linear's default), which "
                        "compiles to a different problem (addmm + add) than a bias-free mm")
    w.add_argument("--max-m", type=int, help="tune dynamic M buckets up to this size")
    w.add_argument("--train", action="store_true", help="models: also collect backward GEMMs")
    w.add_argument("--cache", help="tuning cache file (default <cache_dir>/autotune/tuning.json)")
    w.add_argument("--state", help="state file for resuming (default beside the cache)")
    w.add_argument("--restart", action="store_true", help="ignore the progress file and go through every problem again (records still in "
                        "the cache answer without measuring; `tilewright cache prune` to measure again)")
    w.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="run one Ray task per problem (on ADDRESS, or a local cluster)")
    w.add_argument("--factory", help=argparse.SUPPRESS)  # module:attr, simulated devices in tests
    w.add_argument("--json", help="write the run's report here")
    w.set_defaults(fn=cmd_warm)
