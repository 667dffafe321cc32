"""Issue 9, item 9: targets by what the chip runs. Each CUDA compute capability tilewright knows
gets its own target (exact major.minor: arch-specific cubins load only on the capability they
were built for), with that chip's features; an unknown capability is refused by name, never
mapped onto another chip's target. Devices are faked (``torch.cuda.get_device_properties``)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

from tilewright.autotune.kinds import kind_name
from tilewright.autotune.policy import policy_for
from tilewright.compiler import aot
from tilewright.compiler.capture import CapturedKernel, ModelSpec, capture_kernels
from tilewright.errors import UnknownTargetError
from tilewright.problem import EpilogueOp, GemmProblem
from tilewright.runtime.aot import CompileJob, compile_jobs
from tilewright.runtime.targets import CUDA_CAPABILITIES, TARGETS, detect_target, get_target
from tilewright.runtime.verify import verify
from tilewright.templates import all_templates, get_template

# compute capability -> (target, what triton compiles it as, representative part)
BY_CAPABILITY = {
    (8, 0): ("cuda:sm_80", 80, "A100"),
    (8, 9): ("cuda:sm_89", 89, "L4"),
    (9, 0): ("cuda:sm_90a", 90, "H200"),
    (10, 0): ("cuda:sm_100a", 100, "B200"),
    (10, 3): ("cuda:sm_103a", 103, "B300"),
    (11, 0): ("cuda:sm_110a", 110, "Thor"),
    (12, 0): ("cuda:sm_120", 120, "RTX 5090"),
    (12, 1): ("cuda:sm_121", 121, "GB10"),
}
BF16 = GemmProblem(M=256, N=512, K=384, dtype="bf16", layout_b="col", epilogue=(EpilogueOp("silu"),))


@pytest.fixture
def fake_gpu(monkeypatch):
    """``fake_gpu(major, minor, name)``: every CUDA device reports that capability."""
    def install(major: int, minor: int, name: str = "NVIDIA Fake GPU"):
        props = SimpleNamespace(major=major, minor=minor, name=name, gcnArchName="",
                                multi_processor_count=1)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
        monkeypatch.setattr(torch.version, "hip", None)
        return torch.device("cuda", 0)
    return install


@pytest.mark.parametrize("cc", list(BY_CAPABILITY), ids=[f"cc{a}.{b}" for a, b in BY_CAPABILITY])
def test_targets_by_what_the_chip_runs_each_capability_gets_its_own_target(fake_gpu, cc):
    name, triton_cc, part = BY_CAPABILITY[cc]
    target = detect_target(fake_gpu(*cc, f"NVIDIA {part}"))
    assert target.name == name and CUDA_CAPABILITIES[cc] == name
    assert target.triton == ("cuda", triton_cc, 32)  # the cubins are built for this chip
    assert part in target.device and target.source
    assert target.num_sms > 0 and target.smem_per_block > 0 and target.peak("bf16") > 0


def test_targets_by_what_the_chip_runs_every_cuda_target_is_reachable():
    cuda = {t for t in TARGETS if t.startswith("cuda:")}
    assert set(CUDA_CAPABILITIES.values()) == cuda
    assert len(set(CUDA_CAPABILITIES.values())) == len(CUDA_CAPABILITIES)  # no capability shares one
    for alias, name in {"a100": "cuda:sm_80", "l4": "cuda:sm_89", "b300": "cuda:sm_103a",
                        "sm_103": "cuda:sm_103a", "thor": "cuda:sm_110a", "gb10": "cuda:sm_121"}.items():
        assert get_target(alias).name == name


def test_targets_by_what_the_chip_runs_figures_of_the_new_parts():
    figures = {  # (SMs, shared memory per block in KiB, dense bf16 TFLOP/s)
        "cuda:sm_80": (108, 163, 312.0), "cuda:sm_89": (58, 99, 121.0),
        "cuda:sm_103a": (148, 227, 2250.0), "cuda:sm_110a": (20, 227, 259.0),
        "cuda:sm_121": (48, 99, 125.0),
    }
    for name, (sms, smem_kib, bf16) in figures.items():
        t = get_target(name)
        assert (t.num_sms, t.smem_per_block // 1024, t.peak("bf16")) == (sms, smem_kib, bf16), name
    assert get_target("cuda:sm_80").peak("fp8") == get_target("cuda:sm_80").peak("fp32")  # no fp8
    assert get_target("cuda:sm_103a").peak("fp4") > get_target("cuda:sm_100a").peak("fp4")


def test_targets_by_what_the_chip_runs_features_follow_the_chip():
    def has(name):
        return get_target(name).features

    for old in ("cuda:sm_80", "cuda:sm_89"):  # Ampere/Ada: mma.sync only, no TMA, no PDL
        assert has(old).isdisjoint({"tma", "wgmma", "tcgen05", "pdl", "clusters", "nvfp4"})
        assert "mma_sync" in has(old)
    assert "fp8_e4m3" in has("cuda:sm_89") and "fp8_e4m3" not in has("cuda:sm_80")
    for dc in ("cuda:sm_100a", "cuda:sm_103a", "cuda:sm_110a"):  # tcgen05 and NVFP4 MMA
        assert {"tcgen05", "tma", "nvfp4", "block_scaled_mma"} <= has(dc) and "wgmma" not in has(dc)
    for rtx in ("cuda:sm_120", "cuda:sm_121"):  # no tcgen05, no wgmma; mma.sync block-scaled
        assert has(rtx).isdisjoint({"tcgen05", "wgmma"}) and "nvfp4" in has(rtx)
    assert has("cuda:sm_103a") == has("cuda:sm_100a")  # same engines, its own cubins


def test_targets_by_what_the_chip_runs_sm_103_does_not_get_sm_100a_cubins(fake_gpu):
    b300 = detect_target(fake_gpu(10, 3, "NVIDIA B300 SXM6 AC"))
    b200 = get_target("cuda:sm_100a")
    assert b300.name == "cuda:sm_103a" and b300.arch == "sm_103a" and b300.triton[1] == 103
    # the CuTeDSL sm100 templates compile for sm_100a only: they are not offered on sm_103a
    for t in all_templates():
        if t.backend == "cutedsl":
            assert not t.problem_support(BF16, b300)
            assert "generates for sm_100a" in t.problem_support(BF16, b300).reason or \
                "generates for sm_90a" in t.problem_support(BF16, b300).reason
    # what `tilewright aot` plans for it is compiled for capability 103, under its own names
    kernels, _ = aot.plan([CapturedKernel(BF16, ["inference.gemm_0"])], [b300])
    # Triton's own templates and Helion's (rendered to Triton), both built by Triton for 103
    assert kernels and "triton" in {k.template.backend for k in kernels} <= {"triton", "helion"}
    assert {k.job.target for k in kernels} == {("cuda", 103, 32)}
    assert all(k.name.startswith("sm_103a/") for k in kernels)
    b200_jobs, _ = aot.plan([CapturedKernel(BF16, ["inference.gemm_0"])], [b200])
    assert not {k.job.key for k in kernels} & {k.job.key for k in b200_jobs}


def test_targets_by_what_the_chip_runs_gb10_is_not_an_rtx_5090(fake_gpu):
    # triton builds sm_120a / sm_121a cubins for 12.0 / 12.1: neither loads on the other
    gb10 = detect_target(fake_gpu(12, 1, "NVIDIA GB10"))
    assert gb10.name == "cuda:sm_121" and gb10.triton[1] == 121 and gb10.num_sms == 48
    assert detect_target(fake_gpu(12, 0, "NVIDIA GeForce RTX 5090")).triton[1] == 120


class _Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(64, 96)

    def forward(self, x):
        return torch.softmax(torch.relu(self.lin(x)) * 2.0, dim=-1) + 1.0


@pytest.fixture(scope="module")
def tiny_kernels():
    torch.manual_seed(0)
    return capture_kernels(ModelSpec(_Tiny(), (torch.randn(32, 64),), {}, "tiny"))


@pytest.mark.parametrize("cc", [(8, 0), (8, 9), (11, 0)], ids=["A100", "L4", "Thor"])
def test_targets_by_what_the_chip_runs_ampere_ada_thor_get_triton_candidates(fake_gpu, tiny_kernels, cc):
    """Before, 8.x and 11.x had no target: everything ran on ATen, with a warning per kernel."""
    target = detect_target(fake_gpu(*cc))
    assert target.triton is not None and not target.interpreted
    kinds = {kind_name(c.problem) for c in tiny_kernels}
    assert {"gemm", "pointwise"} <= kinds or {"gemm", "reduction"} <= kinds
    from tilewright.runtime.targets import triton_can_target

    too_old = triton_can_target(target)  # Thor under triton 3.6: its ptxas lacks sm_110a
    for cap in tiny_kernels:
        kind = kind_name(cap.problem)
        cands = policy_for(kind, target).candidates(cap.problem, target)
        generated = [c for c in cands if not c.template_id.startswith("aten.")]
        if too_old:  # refused with the reason, so ATen runs it
            assert not [c for c in generated if c.template_id.startswith("triton.")], too_old
            continue
        assert generated, f"{kind} on {target.name}: ATen only"
        assert all(c.template_id.startswith(("triton.", "helion.")) for c in generated)  # Helion: Triton too
        assert any(c.template_id.startswith("triton.") for c in generated)
    if cc[0] == 8:  # no TMA on Ampere/Ada: the descriptor GEMM refuses, the plain one runs
        assert "no TMA" in get_template("triton.gemm_tma").supports(BF16, target).reason


@pytest.mark.parametrize("cc", [(10, 1), (8, 6), (13, 0), (7, 5), (9, 2)])
def test_targets_by_what_the_chip_runs_unknown_capability_refuses_clearly(fake_gpu, cc):
    dev = fake_gpu(*cc, "NVIDIA Mystery")
    with pytest.raises(UnknownTargetError) as e:
        detect_target(dev)
    text = str(e.value)
    assert f"compute capability {cc[0]}.{cc[1]}" in text and "NVIDIA Mystery" in text
    assert "ATen" in text and "runtime/targets.py" in text and "10.3 (sm_103a)" in text


def test_targets_by_what_the_chip_runs_unknown_gpu_runs_aten_with_one_warning(fake_gpu, tiny_kernels,
                                                                             monkeypatch, caplog):
    from tilewright.compiler import pipeline
    from tilewright.compiler.graph import FusedNode

    monkeypatch.setattr(pipeline, "_unknown_warned", set())
    dev = fake_gpu(10, 1, "NVIDIA Mystery")
    loops = [c.problem for c in tiny_kernels if kind_name(c.problem) != "gemm"]
    with caplog.at_level(logging.WARNING, logger="tilewright.compiler"):
        calls = [pipeline.make_call(FusedNode(f"k{i}", [], problem=p, device=dev))
                 for i, p in enumerate(loops * 3)]
    assert all(c.fixed is not None and c.fixed.template_id.startswith("aten.") for c in calls)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "10.1" in warnings[0].getMessage()


def test_targets_by_what_the_chip_runs_sm_80_gemm_builds_with_mma_sync(tmp_path):
    """An AOT build for sm_80 (no GPU here): warp-level mma.sync, no wgmma/tcgen05, and
    sm_80 code (not an arch-specific sm_80a, which does not exist)."""
    target = get_target("sm_80")
    template = get_template("triton.gemm")
    problem = GemmProblem(M=128, N=128, K=128, dtype="bf16", layout_b="col", epilogue=(EpilogueOp("relu"),))
    params = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 3}
    rendered = template.render(problem, params, target)
    (r,) = compile_jobs([CompileJob("sm80", rendered.source, rendered.aot.to_json(), target.triton)],
                        tmp_path, workers=1, timeout_s=300)
    assert r.ok, r.error
    arts = {k: tmp_path / p for k, p in r.artifacts.items()}
    v = verify(arts, template.expected_instructions(problem, params, target))
    assert v.ok and v.counts[r"mma\.sync\S*\.bf16"] > 0, v.failures
    ptx = arts["ptx"].read_text()
    assert ".target sm_80\n" in ptx and "wgmma" not in ptx and "tcgen05" not in ptx


def test_block_scaled_formats_are_rated_at_their_element_rate():
    gfx950, h200 = get_target("gfx950"), get_target("sm_90a")
    assert gfx950.peak("mxfp4") == gfx950.peak("nvfp4") == dict(gfx950.peak_tflops)["fp4"]
    assert gfx950.peak("mxfp8") == dict(gfx950.peak_tflops)["fp8"]
    assert h200.peak("nvfp4") == h200.peak("bf16")  # no fp4 MMA: dequantised into a bf16 one


@pytest.mark.parametrize("have, refused", [((3, 6), True), ((3, 8), False), ((3, 9), False)])
def test_targets_an_old_triton_cannot_build_are_refused_with_the_reason(monkeypatch, have, refused):
    """Triton 3.6 (the GPU machine's) cannot build sm_110a (its ptxas refuses the arch) and
    builds sm_121's fp8 GEMMs without the e4m3 MMA: those are refused before compiling, saying
    which triton is needed; sm_121's bf16 GEMMs and every other CUDA target still build."""
    from tilewright.runtime import targets

    monkeypatch.setattr(targets, "triton_version", lambda: have)
    bf16 = GemmProblem(M=256, N=512, K=384, dtype="bf16", layout_b="col")
    fp8 = GemmProblem(M=256, N=512, K=512, dtype="fp8e4m3", out_dtype="bf16", layout_b="col")
    gemm = get_template("triton.gemm")
    thor, spark = get_target("sm_110a"), get_target("sm_121")
    for problem, target in ((bf16, thor), (fp8, thor), (fp8, spark)):
        support = gemm.supports(problem, target)
        assert bool(support) is not refused, (problem.dtype, target.name, support)
        if refused:
            assert f"triton {have[0]}.{have[1]}" in support.reason and ">= 3.8" in support.reason
    assert gemm.supports(bf16, spark) and gemm.supports(fp8, get_target("sm_120"))
    kernels, refusals = aot.plan([CapturedKernel(fp8, ["inference.gemm_0"])], [spark, get_target("sm_90a")])
    assert {k.target.name for k in kernels} == ({"cuda:sm_90a"} if refused else {"cuda:sm_90a", "cuda:sm_121"})
    if refused:
        assert any(r["target"] == "cuda:sm_121" and "needs triton >= 3.8" in r["reason"] for r in refusals)
