"""``tilewright demo``: real models through the backend, compared with eager."""

from __future__ import annotations

import argparse
import json

from tilewright.cli.common import console, csv as _csv


def cmd_demo(args: argparse.Namespace) -> int:
    from tilewright.demo.run import CASES, MODES, run_case
    from tilewright.demo.table import print_results

    cases, modes = _csv(args.cases), _csv(args.modes)
    for c in cases:
        if c not in CASES:
            console.print(f"unknown case {c!r}; choose from {', '.join(CASES)}", style="red")
            return 2
    for m in modes:
        if m not in MODES:
            console.print(f"unknown mode {m!r}; choose from {', '.join(MODES)}", style="red")
            return 2
    results = []
    for case in cases:
        for mode in modes:
            with console.status(f"running {case} ({mode})"):
                results.append(run_case(case, mode, inductor=args.inductor and mode == modes[0]))
    print_results(results, console)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": [r.to_json() for r in results]}, f, indent=1)
        console.print(f"wrote {args.json}")
    failed = [r for r in results if not r.passed]
    if failed:
        console.print(f"{len(failed)} of {len(results)} cases failed", style="red")
        return 1
    console.print(f"all {len(results)} cases match eager", style="green")
    return 0


def add_parser(sub) -> None:
    d = sub.add_parser("demo", help="run real models through the backend and compare with eager")
    d.add_argument("--cases", default="minilm,llama-train,llama-bf16,minilm-nvfp4,qwen3-moe-train",
                   help="comma-separated: minilm, llama-train, llama-bf16, minilm-nvfp4, qwen3-moe-train")
    d.add_argument("--modes", default="auto,triton",
                   help="comma-separated: auto (autotuner decides), triton (force generated kernels)")
    d.add_argument("--json", help="also write the results as JSON to this file")
    d.add_argument("--no-inductor", dest="inductor", action="store_false",
                   help="skip compiling each model with Inductor to compare launches (saves ~2 min)")
    d.set_defaults(fn=cmd_demo)
