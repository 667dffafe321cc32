"""The FlyDSL compile driver (``tilewright.templates.flydsl.runtime``): compile-only for an explicit gfx arch
in a child process, the ISA and its LDS/register figures read back, and clear refusals when
the toolchain or the arch is missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tilewright.templates.flydsl import runtime as fly

SMOKE = Path(__file__).parent / "data" / "flydsl_mma_smoke.py"


@pytest.fixture
def toolchain():
    why = fly.toolchain_problem()
    if why:
        pytest.skip(f"FlyDSL compile-only toolchain not ready: {why}")


@pytest.mark.parametrize("arch", ["", "sm_90a", "gfx"])
def test_an_arch_is_always_explicit(arch, tmp_path):
    with pytest.raises(ValueError, match="explicit AMD architecture"):
        fly.compile_env(arch, tmp_path)


def test_a_missing_linker_names_the_setup_step(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEWRIGHT_FLYDSL_ROCM", str(tmp_path / "nothing"))
    why = fly.toolchain_problem()
    assert why and ("make flydsl-setup" in why or "pip install" in why)
    with pytest.raises(fly.FlyDslToolchainError, match="flydsl"):
        fly.compile_source(SMOKE, "gfx950", tmp_path / "dump")


def test_smoke_kernel_compiles_for_gfx950_with_mfma(toolchain, tmp_path):
    res = fly.compile_source(SMOKE, "gfx950", tmp_path / "dump")
    assert res.arch == "gfx950" and res.kernel_name.startswith("gemm_kernel")
    assert res.isa.count("v_mfma_f32_16x16x32_bf16") == 4  # 64x64 tile, 32 deep: 16 atoms over 4 waves
    assert res.scratch_bytes == 0 and 0 < res.vgprs <= 512


def test_a_kernel_that_fails_to_trace_costs_its_own_process(toolchain, tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(SMOKE.read_text().replace("fx.BFloat16)", "fx.NoSuchType)", 1))
    with pytest.raises(fly.FlyDslCompileError, match="failed"):
        fly.compile_source(bad, "gfx950", tmp_path / "dump")
