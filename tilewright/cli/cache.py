"""``tilewright cache list / export / import / prune / clear``: ship and maintain tuning
results."""

from __future__ import annotations

import argparse

from rich.table import Table

from tilewright.cli.common import console, target_name


def open_cache(args: argparse.Namespace, *, read_only: bool = False):
    """The cache named by ``--cache FILE``, else the one under ``config.cache_dir``; strict (a
    file that is not a tuning cache is refused before any work) and, for commands that only
    read, read-only (nothing is written, locked or moved).

    Raises:
        CacheFileError: the file is not a tuning cache or cannot be read.
    """
    from tilewright._config import config
    from tilewright.autotune.cache import TuningCache

    path = getattr(args, "cache", None) or config.cache_path / "autotune" / "tuning.json"
    cache = TuningCache(path, read_only=read_only)
    cache.check()
    return cache


def cmd_list(args: argparse.Namespace) -> int:
    from tilewright.autotune.cache_io import entry_rows

    cache = open_cache(args, read_only=True)
    rows = [r for r in entry_rows(cache.entries())
            if (args.target is None or r["target"] == args.target) and (args.all or r["current"])]
    table = Table(title=f"tuning cache {cache.path} ({len(rows)} problems"
                        f"{'' if args.all else ', installed versions only; --all for every one'})")
    for col in ("problem", "target", "records", "status", "fastest", "ms"):
        table.add_column(col, overflow="fold")
    for r in sorted(rows, key=lambda r: (r["target"], r["problem"])):
        table.add_row(r["problem"], r["target"], str(r["records"]),
                      " ".join(f"{k}:{v}" for k, v in sorted(r["status"].items())),
                      r["fastest"] or "-", f"{r['fastest_ms']:.4g}" if r["fastest_ms"] else "-")
    console.print(table)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from tilewright.autotune.cache_io import export_cache

    n = export_cache(open_cache(args, read_only=True), args.file, target=args.target, current_only=args.current_only)
    console.print(f"exported {n} records to {args.file}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from tilewright.autotune.cache_io import import_bundle

    cache = open_cache(args)
    n = import_bundle(cache, args.file)
    console.print(f"imported {n} records from {args.file} into {cache.path}")
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    from tilewright.autotune.cache_io import prune

    flags = dict(stale_templates=args.stale_templates or args.all,
                 failures=args.failures or args.all,
                 other_versions=args.other_versions or args.all,
                 older_than_days=args.older_than_days)
    report = prune(open_cache(args), **flags)
    console.print(f"removed {report.total} records: {report.invalid} invalid, "
                  f"{report.stale_templates} of changed templates, {report.failures} failures, "
                  f"{report.other_versions} of other versions, {report.older} older")
    if not any(flags.values()):
        console.print("(only invalid records go without a flag: add --stale-templates, --failures, "
                      "--other-versions, --older-than-days N or --all for more)")
    elif args.all:
        console.print("(--all removes every record that is stale, failed or of other versions; "
                      "`tilewright cache clear` removes every record)")
    return 0


def cmd_clear(args: argparse.Namespace) -> int:
    import sys

    from tilewright._config import config
    from tilewright.autotune.cache_io import clear

    cache = open_cache(args)  # refuses, before anything, a file that is not a tuning cache
    # kernel modules live under the cache dir; a --cache file elsewhere leaves them alone
    kernels = config.cache_path / "kernels" if not args.cache or args.kernels else None
    plan = clear(cache, kernels_root=kernels, dry_run=True)
    what = (f"{plan.records} tuning records in {cache.path}, {plan.kernel_modules} generated kernel modules"
            f"{f' under {kernels}' if kernels else ''} and {plan.warm_states} warm progress files")
    if args.dry_run:
        console.print(f"would remove {what}")
        return 0
    if not args.yes:
        if not sys.stdin.isatty():
            console.print(f"cache clear would remove {what}; pass --yes to do it (nothing was removed)")
            return 2
        if input(f"remove {what}? [y/N] ").strip().lower() not in ("y", "yes"):
            console.print("nothing removed")
            return 1
    done = clear(cache, kernels_root=kernels)
    console.print(f"removed {done.records} tuning records, {done.kernel_modules} kernel modules and "
                  f"{done.warm_states} warm progress files")
    if done.kept:
        console.print(f"kept {len(done.kept)} files tilewright did not write: {', '.join(done.kept[:5])}"
                      f"{' ...' if len(done.kept) > 5 else ''}")
    return 0


def add_parser(sub) -> None:
    c = sub.add_parser("cache", help="list, export, import, prune or clear tuning results")
    csub = c.add_subparsers(dest="cache_command", required=True)

    def common(p):
        p.add_argument("--cache", help="a tuning cache file (default: <cache_dir>/autotune/tuning.json)")
        return p

    ls = common(csub.add_parser("list", help="one line per tuned problem"))
    ls.add_argument("--target", type=target_name, help="only this target, e.g. cuda:sm_90a")
    ls.add_argument("--all", action="store_true", help="include problems of other versions")
    ls.set_defaults(fn=cmd_list)
    ex = common(csub.add_parser("export", help="write the results to one .json or .sqlite file"))
    ex.add_argument("file")
    ex.add_argument("--target", type=target_name, help="only this target")
    ex.add_argument("--current-only", action="store_true",
                    help="only records valid for the installed versions and templates")
    ex.set_defaults(fn=cmd_export)
    im = common(csub.add_parser("import", help="merge a .json or .sqlite bundle into the cache"))
    im.add_argument("file")
    im.set_defaults(fn=cmd_import)
    pr = common(csub.add_parser("prune", help="remove invalid, stale or failed records (invalid "
                                              "ones always; the flags say what else)"))
    pr.add_argument("--stale-templates", action="store_true",
                    help="records of template sources no longer installed")
    pr.add_argument("--failures", action="store_true",
                    help="failed and wrong candidates (they will be tried again)")
    pr.add_argument("--other-versions", action="store_true",
                    help="problems tuned with other torch/triton/tilewright versions")
    pr.add_argument("--older-than-days", type=float, help="records older than this")
    pr.add_argument("--all", action="store_true",
                    help="the first three together (not every record: see `cache clear`)")
    pr.set_defaults(fn=cmd_prune)
    cl = common(csub.add_parser("clear", help="remove every tuning record, the generated kernel modules and "
                                              "warm progress files (only files tilewright wrote)"))
    cl.add_argument("--yes", "-y", action="store_true", help="do not ask (needed without a terminal)")
    cl.add_argument("--dry-run", action="store_true", help="say what would go, remove nothing")
    cl.add_argument("--kernels", action="store_true",
                    help="with --cache: also the kernel modules under the cache dir (its default includes them)")
    cl.set_defaults(fn=cmd_clear)
