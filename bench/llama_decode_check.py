"""A tiny Llama decode step end to end (bench/device_check.sh): tilewright vs Inductor vs eager,
as JSON (launches per step, steady-state ms per step, first-call seconds, error vs float64).

The model is the demo's 2-layer Llama (tilewright.demo.models.build_llama: hidden 128, 4 heads /
2 KV heads, vocab 512) in bf16, called on one new token for each of ``--batch`` sequences (the
decode step's shapes: M = batch in every projection; no KV cache, so attention is over the one
position). Inductor is ``mode="max-autotune-no-cudagraphs"`` on a GPU (its own launches, like
tilewright's; on the CPU the default mode). Each backend's row is written as soon as it is
measured, so a run cut short keeps what it has. ``--dry-run``: fp32 on the CPU (Triton
interpreter), for CI. Needs transformers (the GPU machine has it); without it the JSON says
"skipped" and the exit code is 0.

usage: python bench/llama_decode_check.py OUT.json [--dry-run] [--batch B]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import json
import sys
import time
from pathlib import Path

import torch


def _logits(out) -> torch.Tensor:
    return out.logits if hasattr(out, "logits") else out[0]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--inductor", action="store_true",
                    help="with --dry-run: time Inductor too (its C++ compile takes about a minute here)")
    args = ap.parse_args()
    out = Path(args.out)
    doc: dict = {"model": "demo llama (2 layers, hidden 128), one decode step", "rows": []}
    if importlib.util.find_spec("transformers") is None:
        doc["skipped"] = "transformers is not installed"
        out.write_text(json.dumps(doc, indent=1))
        print("llama_decode_check: skipped, transformers is not installed")
        return 0

    import tilewright  # noqa: F401 - registers backend="tilewright"
    from tilewright.autotune.bench import time_callable
    from tilewright.compiler.report import collect_reports
    from tilewright.demo.inductor import inductor_counting
    from tilewright.demo.models import build_llama, llama_inputs

    device = torch.device("cpu" if args.dry_run else "cuda")
    dtype = torch.float32 if args.dry_run else torch.bfloat16
    model = build_llama(dtype).to(device).eval()
    ids = llama_inputs(batch=args.batch, seq=1).to(device)
    doc |= {"device": str(device), "dtype": str(dtype).removeprefix("torch."), "batch": args.batch}
    with torch.no_grad():  # the same (rounded) weights, in float64
        ref = _logits(copy.deepcopy(model).double()(ids))

    def measure(name: str, fn, launches) -> None:
        row: dict = {"backend": name}
        try:
            with torch.no_grad():
                t0 = time.perf_counter()
                got = _logits(fn(ids))
                if device.type == "cuda":
                    torch.cuda.synchronize()
                row["first_call_s"] = round(time.perf_counter() - t0, 3)
                row["rel_err"] = ((got.double() - ref).norm() / ref.norm()).item()
                t = time_callable(lambda: fn(ids), device, warmup=3, rep=50, budget_ms=3000)
            row |= {"ms": t.median_ms, "launches": launches(), "status": "ok"}
        except Exception as e:  # noqa: BLE001 - one backend's failure is reported, the rest run
            row |= {"status": "failed", "reason": f"{type(e).__name__}: {e}"[:400]}
        doc["rows"].append(row)
        out.write_text(json.dumps(doc, indent=1))

    measure("eager", model, lambda: None)
    torch._dynamo.reset()
    with collect_reports() as reports:
        tw = torch.compile(model, backend="tilewright", dynamic=False)
        measure("tilewright", tw, lambda: sum(g.launches for g in reports))
    torch._dynamo.reset()
    if args.dry_run and not args.inductor:
        doc["rows"].append({"backend": "inductor", "status": "skipped",
                            "reason": "dry run: Inductor's C++ compile takes ~1 min on the CPU (--inductor)"})
        return report(doc, dtype, out)
    from torch._inductor import config as inductor_config

    # max-autotune without CUDA graphs (what mode="max-autotune-no-cudagraphs" sets); the
    # counting backend takes no mode, so the settings are patched around its first call
    autotune = contextlib.nullcontext() if args.dry_run else inductor_config.patch(
        max_autotune=True, max_autotune_gemm=True, triton_cudagraphs=False)
    with inductor_counting() as (backend, graphs), autotune:
        ind = torch.compile(model, backend=backend, dynamic=False)
        measure("inductor", ind, lambda: sum(g.launches for g in graphs))
    return report(doc, dtype, out)


def report(doc: dict, dtype: torch.dtype, out: Path) -> int:
    """Write and print the rows; exit code 1 when tilewright's row failed or is wrong."""
    rows = {r["backend"]: r for r in doc["rows"]}
    if all(rows.get(k, {}).get("status") == "ok" for k in ("tilewright", "inductor")):
        doc["speedup_vs_inductor"] = rows["inductor"]["ms"] / rows["tilewright"]["ms"]
    out.write_text(json.dumps(doc, indent=1))
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    for r in doc["rows"]:
        print(f"llama_decode_check {r['backend']:10s} {r['status']:6s} ms={r.get('ms', float('nan')):.4f} "
              f"launches={r.get('launches')} rel_err={r.get('rel_err', float('nan')):.2e}")
    bad = [r for r in doc["rows"] if r["status"] == "failed" or r.get("rel_err", 0) > tol]
    return 1 if any(r["backend"] == "tilewright" for r in bad) else 0


if __name__ == "__main__":
    sys.exit(main())
