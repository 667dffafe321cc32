"""Helion templates on the device (bench/device_check.sh, step 2): a residual RMSNorm, a
softmax and a Linear + GELU GEMM, each tuned with Helion and the jinja Triton templates
competing (``force_backend="triton,helion"``), every candidate checked against float64 with
poisoned outputs and timed by the tuner. Writes JSON (one row per problem: the winner, the best
Helion and the best Triton candidate and ATen, in ms) and prints the rows.

usage: python bench/helion_check.py OUT.json [--dry-run]   (--dry-run: cpu, interpreter sizes)
Exits 0 with a "skipped" row when Helion is not installed (it is the ``helion`` extra).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import torch
from torch import nn


class ResidualRMSNorm(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.norm = nn.RMSNorm(n, eps=1e-5)

    def forward(self, x, res):
        h = x + res
        return self.norm(h), h


class Softmax(nn.Module):
    def forward(self, x):
        return torch.softmax(x, -1)


class LinearGelu(nn.Module):
    def __init__(self, k: int, n: int):
        super().__init__()
        self.proj = nn.Linear(k, n)

    def forward(self, x):
        return nn.functional.gelu(self.proj(x))


def main(out: Path, dry_run: bool) -> int:
    if importlib.util.find_spec("helion") is None:
        rows = [{"problem": "all", "skipped": "helion is not installed (pip install 'tilewright[helion]')"}]
        out.write_text(json.dumps(rows, indent=1))
        print("helion_check: skipped, helion is not installed")
        return 0
    import tilewright
    from tilewright.autotune.select import select
    from tilewright.compiler import aot
    from tilewright.compiler.capture import ModelSpec
    from tilewright.compiler.kernel_factory import default_factory
    from tilewright.runtime.targets import detect_target, get_target

    dev = "cpu" if dry_run else "cuda"
    target = get_target("cpu") if dry_run else detect_target(torch.device("cuda"))
    rows_, d, n = (16, 64, 64) if dry_run else (8192, 4096, 4096)
    dt = torch.float16 if dry_run else torch.bfloat16
    models = {
        "residual_rms_norm": (ResidualRMSNorm(d).to(dt), (torch.randn(rows_, d, dtype=dt), torch.randn(rows_, d, dtype=dt))),
        "softmax": (Softmax(), (torch.randn(rows_, d, dtype=dt),)),
        "linear_gelu": (LinearGelu(d, n).to(dt), (torch.randn(rows_, d, dtype=dt),)),
    }
    rows = []
    for name, (model, inputs) in models.items():
        t0 = time.perf_counter()
        spec = ModelSpec(model.to(dev), tuple(x.to(dev) for x in inputs), {}, name)
        problem = next(c.problem for c in aot.capture_kernels(spec))
        with tilewright.config.patch(force_backend="triton,helion", max_candidates=4):
            sel = select(problem, target, default_factory)
        best = {}
        for r in sel.results:
            if r.record.status == "ok" and r.record.median_ms is not None:
                lang = r.candidate.backend
                best[lang] = min(best.get(lang, float("inf")), r.record.median_ms)
        rows.append({"problem": name, "describe": problem.describe(), "winner": sel.winner.name,
                     "ms": best, "failed": [r.candidate.name for r in sel.results if r.record.status == "failed"],
                     "seconds": round(time.perf_counter() - t0, 1)})
        print(f"helion_check {name:18s} winner {sel.winner.name:60s} "
              + " ".join(f"{k}={v:.4f}ms" for k, v in sorted(best.items())))
    out.write_text(json.dumps({"target": target.name, "rows": rows}, indent=1))
    return 1 if any(r["failed"] and "helion" not in r["ms"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), "--dry-run" in sys.argv[2:]))
