"""Cross-arch ahead-of-time builds on this CPU-only machine: every template compiles for every
target it claims and uses the engines it promises; the manifest is complete; re-runs rebuild
nothing; refusals come before compiling; a crashing or hanging compile costs one kernel."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch.nn as nn

from tilewright.compiler import aot
from tilewright.compiler.capture import CapturedKernel, ModelSpec
from tilewright.errors import UnsupportedProblemError
from tilewright.problem import EpilogueInput, EpilogueOp, GemmProblem
from tilewright.runtime.aot import CompileJob, compile_jobs
from tilewright.runtime.languages import get_language
from tilewright.runtime.targets import TARGETS, get_target, triton_can_target
from tilewright.runtime.verify import InstructionCheck, verify
from tilewright.templates import all_templates, get_template

GPU_TARGETS = [t for t in TARGETS.values() if t.triton is not None]
BF16 = GemmProblem(M=256, N=512, K=384, dtype="bf16", layout_b="col",
                   epilogue=(EpilogueOp("add", input=0), EpilogueOp("gelu"), EpilogueOp("silu"),
                             EpilogueOp("gelu_tanh")), epilogue_inputs=(EpilogueInput("N", "bf16"),))
FP8 = GemmProblem(M=256, N=512, K=512, dtype="fp8e4m3", out_dtype="bf16", layout_b="col",
                  epilogue=(EpilogueOp("mul", input=0), EpilogueOp("mul", input=1)),
                  epilogue_inputs=(EpilogueInput("M", "fp32"), EpilogueInput("N", "fp32")))


def pairs():
    for template in all_templates():
        if template.backend == "aten":
            continue
        for target in GPU_TARGETS:
            for problem in (BF16, FP8):
                if template.supports(problem, target):
                    yield pytest.param(template, target, problem,
                                       id=f"{template.id}-{target.name}-{problem.dtype}")


def big_tile(template, target, problem=BF16) -> dict:
    seeds = template.seed_params(problem, target)
    if seeds is not None:  # templates with their own knobs (CuTeDSL)
        params = seeds[0]
        assert template.check(params, problem, target) is None
        return params
    # the first of these the template accepts: its register check refuses tiles measured to
    # spill (the pointer GEMM's 128x128x64 with four warps does on sm_90a/sm_100a) and those
    # measured at the edge of the budget (32x64x128 with two warps took all 255 registers)
    for bm, bn, bk, warps in ((128, 128, 64, 4), (128, 128, 64, 8), (64, 64, 32, 4), (32, 64, 128, 2),
                              (32, 64, 64, 2)):
        params = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "num_warps": warps,
                  "num_stages": 3 if target.backend == "cuda" else 2}
        if template.check(params, BF16, target) is None:
            return params
    raise AssertionError(f"{template.id} accepts no big tile on {target.name}")


@pytest.mark.slow
def test_every_template_compiles_for_every_target_it_claims(tmp_path):
    cases = list(pairs())
    claimed = {"cuda:sm_90a", "cuda:sm_100a", "hip:gfx950", "hip:gfx1250"}
    claimed = {t for t in claimed if triton_can_target(get_target(t)) is None}  # gfx1250 needs triton 3.9
    assert {c.values[1].name for c in cases} >= claimed
    jobs, meta = [], {}
    for case in cases:
        template, target, problem = case.values
        params = big_tile(template, target, problem)
        rendered = template.render(problem, params, target)
        name = case.id.replace(":", "_").replace(".", "_")
        jobs.append(CompileJob(name, rendered.source, rendered.aot.to_json(), target.triton))
        meta[name] = (template, target, problem, params)
    results = compile_jobs(jobs, tmp_path, workers=2, timeout_s=600)
    failures = []
    for r in results:
        template, target, problem, params = meta[r.name]
        if not r.ok:
            failures.append(f"{r.name}: {r.status} {r.error[-300:]}")
            continue
        checks = template.expected_instructions(problem, params, target)
        assert checks, f"{template.id} promises nothing on {target.name}"
        v = verify({k: tmp_path / p for k, p in r.artifacts.items()}, checks)
        if not v.ok:
            failures.append(f"{r.name}: {v.failures}")
    assert not failures, "\n".join(failures)


def test_refusals_come_before_compiling_with_a_reason():
    gluon = get_template("gluon.gemm_tdm")
    with pytest.raises(UnsupportedProblemError, match="written for gfx1250"):
        gluon.render(BF16, gluon.space.default(), get_target("cuda:sm_90a"))
    tma = get_template("triton.gemm_tma")
    ragged = GemmProblem(M=64, N=64, K=65, dtype="bf16")
    assert "multiple of 16" in tma.supports(ragged, get_target("cuda:sm_90a")).reason
    assert "no TMA" in tma.supports(BF16, get_target("hip:gfx942")).reason or \
        "not generated" in tma.supports(BF16, get_target("hip:gfx942")).reason
    fp8_on_old = get_template("triton.gemm").supports(FP8, get_target("mps"))
    assert not fp8_on_old
    kernels, refused = aot.plan([CapturedKernel(BF16, ["inference.gemm_0"])], [get_target("hip:gfx950")])
    reasons = {r["template"]: r["reason"] for r in refused}
    assert "gfx1250" in reasons.pop("gluon.gemm_tdm")
    fly_why = reasons.pop("flydsl.gemm", None)  # planned where the FlyDSL toolchain is (test_flydsl_gemm.py)
    mx_why = reasons.pop("flydsl.mx_gemm", "mxfp4")
    assert "mxfp4" in mx_why or "flydsl is not installed" in mx_why  # MX formats only, not bf16
    if get_language("helion").check() is not None:  # not installed (the GPU machine's case)
        assert "helion" in reasons.pop("helion.gemm")
    assert all("NVFP4" in why or "nvfp4" in why.lower() for why in reasons.values()), reasons
    helion = {"helion.gemm"} if get_language("helion").check() is None else set()
    assert {k.template.id for k in kernels} == {"triton.gemm", "triton.gemm_tma"} | helion | (
        set() if fly_why else {"flydsl.gemm"})
    assert all(k.job is not None for k in kernels)


def test_a_promise_not_kept_is_reported(tmp_path):
    # a BLOCK_M=16 tile cannot use wgmma: checking it against a wgmma promise must fail
    template, target = get_template("triton.gemm"), get_target("cuda:sm_90a")
    params = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 4, "num_warps": 4, "num_stages": 3}
    rendered = template.render(BF16, params, target)
    (r,) = compile_jobs([CompileJob("small", rendered.source, rendered.aot.to_json(), target.triton)], tmp_path)
    assert r.ok
    arts = {k: tmp_path / p for k, p in r.artifacts.items()}
    promised = template.expected_instructions(BF16, params, target)
    assert verify(arts, promised).ok  # its own promise is mma.sync, and it keeps it
    wgmma = [InstructionCheck("ptx", (r"wgmma\.mma_async",), (), "warpgroup MMA")]
    result = verify(arts, wgmma)
    assert not result.ok and "lacks" in result.failures[0] and "warpgroup MMA" in result.failures[0]


CRASH = """
import os
os.abort()
"""
HANG = """
import time
time.sleep(3600)
"""


def test_a_crashing_or_hanging_compile_costs_one_kernel(tmp_path):
    template, target = get_template("triton.gemm"), get_target("hip:gfx950")
    good = template.render(BF16, big_tile(template, target), target)
    jobs = [CompileJob("crash", CRASH, good.aot.to_json(), target.triton),
            CompileJob("hang", HANG, good.aot.to_json(), target.triton),
            CompileJob("broken", good.source.replace("tl.dot(", "tl.no_such_op("), good.aot.to_json(), target.triton),
            CompileJob("good", good.source, good.aot.to_json(), target.triton)]
    results = {r.name: r for r in compile_jobs(jobs, tmp_path, workers=2, timeout_s=20)}
    assert results["crash"].status == "crashed" and "SIGABRT" in results["crash"].error
    assert results["hang"].status == "timeout"
    assert results["broken"].status == "failed" and "no_such_op" in results["broken"].error
    assert results["good"].status == "built"
    import psutil

    left = [p for p in psutil.Process().children(recursive=True)
            if "resource_tracker" not in " ".join(p.cmdline())]  # multiprocessing's own helper
    assert not left, f"worker processes left running: {left}"


class TinyMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(64, 128), nn.Linear(128, 64)

    def forward(self, x):
        return self.down(nn.functional.silu(self.up(x))) + x


@pytest.mark.slow
def test_build_writes_a_complete_manifest_and_rebuilds_nothing(tmp_path):
    import torch

    spec = ModelSpec(TinyMLP().to(torch.bfloat16), (torch.randn(32, 64, dtype=torch.bfloat16),), {}, "tiny")
    targets = ["sm_90a", "sm_100a", "gfx950", "gfx1250"]
    report = aot.build(spec, targets, tmp_path, workers=2)
    assert report.ok, [(k.name, k.result.error if k.result else None, k.verify_failures) for k in report.kernels]
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["targets"] == ["cuda:sm_90a", "cuda:sm_100a", "hip:gfx950", "hip:gfx1250"]
    assert manifest["summary"]["built"] == len(manifest["kernels"]) > 0
    for k in manifest["kernels"]:
        assert {"name", "target", "problem", "template", "params", "predicted_ms", "bound",
                "artifacts", "hashes", "verify", "aot", "uses"} <= set(k)
        assert k["verify"]["ok"]
        binary = "cubin" if k["target"].startswith("cuda") else "hsaco"
        if k["template"].startswith("flydsl."):  # FlyDSL keeps the source and the final ISA
            assert {"source", "amdgcn"} <= set(k["artifacts"])
            continue
        if k["template"].startswith("cutedsl."):  # cute.compile dumps PTX and cubin
            assert {"source", "ptx", binary} <= set(k["artifacts"])
            continue
        assert {"source", "ttgir", "llir", binary} <= set(k["artifacts"])
        if k["template"].startswith("triton."):
            assert "ttir" in k["artifacts"]
        for stage, rel in k["artifacts"].items():
            data = (tmp_path / "kernels" / rel).read_bytes()
            import hashlib

            assert hashlib.sha256(data).hexdigest() == k["hashes"][stage]
    if triton_can_target(get_target("gfx1250")) is None:  # triton < 3.9 refuses gfx1250 kernels
        assert any(k["template"] == "gluon.gemm_tdm" for k in manifest["kernels"])
    assert any(k["template"] == "triton.gemm_tma" for k in manifest["kernels"])
    again = aot.build(spec, targets, tmp_path, workers=2)
    assert {k.result.status for k in again.kernels} == {"cached"}


@pytest.mark.slow
def test_cli_builds_the_demo_llama(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "tilewright", "aot", "tilewright.demo.models:llama_example",
         "--target", "sm_90a,sm_100a,gfx950,gfx1250", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=1500)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert re.search(r"all \d+ kernels built and passed their instruction checks", out.stdout)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    # issue 18's done-when for this model (tests/test_registers.py has the NVFP4 decode one):
    # no spilling kernel chosen on any target, registers read from nearly every artifact
    assert manifest["summary"]["spilling"] == 0
    read = [k for k in manifest["kernels"] if k["resources"] is not None]
    assert len(read) >= 0.9 * len(manifest["kernels"])
    assert not [k["name"] for k in read if k["resources"]["spills"]]
    assert len({k["problem_text"] for k in manifest["kernels"]}) >= 6
    # the pointwise and reduction kernels are built too, not only the GEMMs
    kinds = {(k["target"], k["kind"]) for k in manifest["kernels"]}
    assert {(t, kind) for t in ("cuda:sm_90a", "hip:gfx1250") for kind in ("gemm", "pointwise", "reduction")} <= kinds
    if triton_can_target(get_target("gfx1250")) is None:  # its RMSNorm moves rows through TDM
        rms = [k for k in manifest["kernels"] if k["target"] == "hip:gfx1250" and k["kind"] == "reduction"
               and "rsqrt" in k["problem_text"] and k["params"].get("DESC")]
        assert rms and all(k["verify"]["counts"].get("tensor_load_to_lds", 0) >= 1 for k in rms)


def test_exported_dynamic_dims_stay_dynamic(tmp_path):
    """Regression: a .pt2 export's symbolic batch came back static, so AOT kernels assumed M % 16."""
    import torch
    from torch.export import Dim, export, save

    from tilewright.compiler.capture import capture_gemms, load_model

    ep = export(TinyMLP(), (torch.randn(32, 64),), dynamic_shapes={"x": {0: Dim("B", min=2, max=1024)}})
    save(ep, str(tmp_path / "tiny.pt2"))
    spec = load_model(str(tmp_path / "tiny.pt2"))
    problems = [c.problem for c in capture_gemms(spec)]
    assert problems and all(p.dynamic == {"M"} for p in problems)
    kernels, _ = aot.plan(capture_gemms(spec), [get_target("cuda:sm_90a")])
    assert all("M" not in k.job.spec["divisible_by_16"] for k in kernels)


def test_bad_model_specs_are_named():
    from tilewright.compiler.capture import load_model
    from tilewright.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="module:callable"):
        load_model("no_colon_here")
    with pytest.raises(InvalidInputError, match="cannot import"):
        load_model("tilewright.demo.models:no_such_thing")
    with pytest.raises(InvalidInputError, match="not a callable"):
        load_model("tilewright.demo.models:SENTENCES")
