"""Ahead-of-time builds of attention kernels: captured from models (SDPA forward and backward,
FlexAttention with a block mask), planned through the attention policy, built for the GPU
targets and checked for their instructions (tensor descriptors become TMA on sm_90a/sm_100a and
the Tensor Data Mover on gfx1250); Metal and SYCL refuse attention with a reason."""

from __future__ import annotations

import pytest

from tilewright.attention import AttentionProblem
from tilewright.compiler import aot
from tilewright.compiler.capture import capture_kernels, load_model
from tilewright.runtime.aot import compile_jobs
from tilewright.runtime.targets import get_target, triton_can_target
from tilewright.runtime.verify import verify


@pytest.fixture(scope="module")
def block_train():
    return [c for c in capture_kernels(load_model("tilewright.demo.models:attention_block_example"), train=True)
            if isinstance(c.problem, AttentionProblem)]


@pytest.fixture(scope="module")
def flex():
    return [c for c in capture_kernels(load_model("tilewright.demo.models:flex_example"))
            if isinstance(c.problem, AttentionProblem)]


def test_sdpa_and_flex_are_captured_as_attention_problems(block_train, flex):
    assert sorted(c.problem.direction for c in block_train) == ["backward", "forward"]
    fwd = next(c.problem for c in block_train if c.problem.direction == "forward")
    assert (fwd.B, fwd.H, fwd.H_kv, fwd.Sq, fwd.D, fwd.causal, fwd.dtype) == (2, 4, 2, 64, 32, True, "bf16")
    (f,) = [c.problem for c in flex]
    assert f.block_mask is not None and f.block_mask.q_block == 32 and f.score_mod and f.mask_mod
    assert f.lse_base == "2" and len(f.captures) == 1  # the document ids


def _build(kernels, tmp_path):
    root = tmp_path / "kernels"
    results = compile_jobs([k.job for k in kernels], root, workers=2)
    out = {}
    for k, r in zip(kernels, results):
        assert r.ok, f"{k.name}: {r.status} {r.error[-400:]}"
        v = verify({s: root / rel for s, rel in r.artifacts.items()},
                   k.template.expected_instructions(k.captured.problem, k.params, k.target))
        assert v.ok, f"{k.name}: {v.failures}"
        out[k.name] = v.counts
    return out


def test_gfx1250_builds_the_flex_kernel_with_the_tensor_data_mover(flex, tmp_path):
    if (why := triton_can_target(get_target("gfx1250"))) is not None:
        pytest.skip(why)
    kernels, refused = aot.plan(flex, [get_target("gfx1250")])
    prefill = [k for k in kernels if k.template.id == "triton.attention"]
    assert len(prefill) == 1 and prefill[0].params["DESC"], "descriptors rank first where TDM moves them"
    counts = _build(prefill, tmp_path)
    (c,) = counts.values()
    assert c.get("tensor_load_to_lds", 0) > 0 and c.get("v_wmma", 0) > 0, c


@pytest.mark.slow
@pytest.mark.parametrize("target_name", ["sm_90a", "sm_100a", "gfx950", "gfx1250"])
def test_attention_forward_and_backward_build_and_check_on_every_gpu_target(block_train, target_name, tmp_path):
    kernels, _ = aot.plan(block_train, [get_target(target_name)])
    assert {k.template.id for k in kernels} >= {"triton.attention", "triton.attention_bwd"}
    counts = _build(kernels, tmp_path)
    engine = {"sm_90a": r"cp\.async\.bulk\.tensor", "sm_100a": r"cp\.async\.bulk\.tensor", "gfx1250": "tensor_load_to_lds"}
    if target_name in engine:
        assert all(any(engine[target_name] in p for p in c) for c in counts.values()), counts


def test_metal_and_sycl_refuse_attention_with_a_reason(block_train):
    from tilewright.compiler.aot_metal import plan_metal
    from tilewright.compiler.aot_sycl import plan_sycl

    for plan_written, target in ((plan_metal, "mps"), (plan_sycl, "xpu")):
        kernels, refused, _ = plan_written(block_train, [get_target(target)])
        assert kernels == []
        reasons = [r["reason"] for r in refused if "sdpa" in r["problem"]]
        assert reasons and all("attention" in r for r in reasons), refused
