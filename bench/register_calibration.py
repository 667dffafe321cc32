"""Register calibration: compile GEMM tiles ahead of time for sm_90a, sm_100a, gfx950 and gfx1250
and record what each uses (registers or VGPRs per thread, spills, stack) as read from the
artifacts (``tilewright.runtime.resources``).

The JSON it writes (``bench/register_calibration.json`` by default) is the data the register
estimate of the Triton GEMM templates (``tilewright/templates/triton/registers.py``) is fitted
on, and ``tests/test_registers.py`` checks the estimate against it: every tile that spilled must
be estimated over its target's budget. Rerun after a Triton upgrade or a template change:

    PYTHONPATH=. python bench/register_calibration.py [--out FILE]      # compile, measure, emit
    PYTHONPATH=. python bench/register_calibration.py --emit-only         # the table from the JSON

No GPU needed: 160 compiles, 5-30 minutes on 2 shared CPUs. Both write the JSON's table to
``tilewright/templates/triton/register_table.py`` (``--table``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from tilewright.problem import GemmProblem
from tilewright.runtime.aot import CompileJob, compile_jobs
from tilewright.runtime.resources import read_resources
from tilewright.runtime.targets import get_target
from tilewright.templates import get_template

TARGETS = ("sm_90a", "sm_100a", "gfx950", "gfx1250")
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps): the decode and general tiles the GEMM policy proposes,
# including the shape that spilled everywhere (16x32x256, one warp)
DENSE_TILES = (
    (16, 32, 128, 1), (16, 32, 256, 1), (16, 64, 128, 1), (16, 64, 256, 2), (16, 128, 128, 2),
    (16, 256, 64, 4), (32, 32, 256, 1), (32, 64, 128, 2), (32, 64, 256, 2), (32, 128, 128, 4),
    (64, 64, 64, 4), (64, 64, 128, 4), (64, 128, 64, 4), (128, 128, 64, 4), (128, 128, 64, 8),
    (128, 256, 64, 8),
)
NVFP4_TILES = (
    (16, 32, 128, 1), (16, 64, 128, 2), (16, 64, 256, 4), (32, 64, 128, 4), (64, 64, 128, 4),
    (128, 128, 128, 4), (128, 128, 128, 8), (128, 64, 256, 8),
)


def jobs_for(target_name: str) -> list[tuple[CompileJob, dict]]:
    target = get_target(target_name)
    stages = 2 if target.backend == "hip" else 3
    dense = GemmProblem(512, 512, 512, "bf16", layout_b="col")
    nvfp4 = GemmProblem(512, 512, 512, "nvfp4", layout_b="col", scale_layout="row")
    out = []
    plan = [("triton.gemm", dense, DENSE_TILES), ("triton.gemm_tma", dense, DENSE_TILES),
            ("triton.gemm_nvfp4", nvfp4, NVFP4_TILES)]
    for template_id, problem, tiles in plan:
        template = get_template(template_id)
        if not template.supports(problem, target):
            continue
        for bm, bn, bk, warps in tiles:
            params = template.space.complete({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8,
                                              "num_warps": warps, "num_stages": stages})
            # rendered without the template's checks: the register refusal is what this calibrates
            source = template.render_jinja(**template.context(problem, params, target))
            name = f"{target.arch}/{template_id.replace('.', '_')}-{bm}x{bn}x{bk}w{warps}s{stages}"
            job = CompileJob(name, source, template.aot_spec(problem, params).to_json(), target.triton)
            out.append((job, {"template": template_id, "target": target.name, "dtype": problem.dtype,
                              "params": params}))
    return out


TABLE = Path(__file__).resolve().parent.parent / "tilewright" / "templates" / "triton" / "register_table.py"


def spilled(res: dict) -> bool:
    """The rule of ``Resources.spills`` (recomputed: older JSON kept another)."""
    return bool(res["spill_stores"] or res["spill_loads"] or res["vgpr_spills"]
                or (res["sgpr_spills"] and res["stack"]))


def fit_and_table(data: dict) -> tuple[dict, dict]:
    """Per (arch, template): every measured tile → (registers, spilled), and the least-squares
    fit ``c0 + c_acc * acc + c_ops * ops`` on the non-spilling tiles (features as
    ``registers.features``)."""
    import numpy as np

    from tilewright.runtime.targets import get_target
    from tilewright.templates.triton.registers import features

    measured: dict = {}
    rows: dict = {}
    for r in data["rows"]:
        if r.get("status") != "built" or not r.get("resources"):
            continue
        target = get_target(r["target"])
        p = r["params"]
        key = (target.arch, r["template"])
        res = r["resources"]
        measured.setdefault(key, {})[(p["BLOCK_M"], p["BLOCK_N"], p["BLOCK_K"], p["num_warps"])] = (
            res["registers"], spilled(res))
        if not spilled(res):
            rows.setdefault(key, []).append((*features(p, target), res["registers"]))
    fits = {}
    for key, pts in rows.items():
        if len(pts) < 3:
            continue
        X = np.array([[1.0, a, o] for a, o, _ in pts])
        y = np.array([regs for _, _, regs in pts], dtype=float)
        c, *_ = np.linalg.lstsq(X, y, rcond=None)
        fits[key] = tuple(round(float(v), 3) for v in c)
    return measured, fits


def emit(data: dict, path: Path = TABLE) -> None:
    measured, fits = fit_and_table(data)
    lines = ['"""Generated by bench/register_calibration.py from bench/register_calibration.json '
             f'(triton {data["triton"]}) — do not edit.',
             "",
             "MEASURED: (arch, template) -> {(BLOCK_M, BLOCK_N, BLOCK_K, num_warps): (registers, spilled)};",
             "FITS: (arch, template) -> (c0, c_acc, c_ops) fitted on the non-spilling tiles.", '"""', "",
             "MEASURED = {"]
    for key in sorted(measured):
        lines.append(f"    {key!r}: {{")
        for tile in sorted(measured[key]):
            lines.append(f"        {tile!r}: {measured[key][tile]!r},")
        lines.append("    },")
    lines += ["}", "", "FITS = {"] + [f"    {k!r}: {v!r}," for k, v in sorted(fits.items())] + ["}", ""]
    path.write_text("\n".join(lines))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).with_suffix(".json")))
    ap.add_argument("--build", default=None, help="artifact folder (default: a temporary one)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--table", default=str(TABLE))
    ap.add_argument("--emit-only", action="store_true", help="only regenerate the table from --out")
    args = ap.parse_args(argv)
    if args.emit_only:
        emit(json.loads(Path(args.out).read_text()), Path(args.table))
        return 0
    planned = [item for t in TARGETS for item in jobs_for(t)]
    build = Path(args.build or tempfile.mkdtemp(prefix="tw-regcal-"))
    t0 = time.time()
    results = compile_jobs([j for j, _ in planned], build, workers=args.workers)
    rows = []
    import triton

    for (job, info), result in zip(planned, results):
        if not result.ok:
            rows.append({**info, "status": result.status, "error": result.error[:300]})
            continue
        res = read_resources({s: build / p for s, p in result.artifacts.items()})
        rows.append({**info, "status": "built", "resources": res.to_json() if res else None})
    data = {"triton": triton.__version__, "problem": "512x512x512, A row-major, B (N, K)",
            "seconds": round(time.time() - t0, 1), "rows": rows}
    Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
    emit(data, Path(args.table))
    spilling = [r for r in rows if r.get("resources") and spilled(r["resources"])]
    print(f"{len(rows)} kernels, {len(spilling)} spill; written to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
