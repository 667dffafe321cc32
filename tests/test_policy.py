"""Candidate policies: clamped to the problem, legal on the target, short, ranked, ATen first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tilewright
from tilewright.autotune.cost_model import estimate_gemm, roofline_ms
from tilewright.autotune.policy import policy_for
from tilewright.problem import GemmProblem
from tilewright.runtime.targets import get_target
from tilewright.templates import get_template

SHAPES = json.loads((Path(__file__).parents[1] / "bench/cases/llm_gemm_shapes.json").read_text())


def llm_problems():
    """Every (M, N, K) of the LLM table once, named after its first model and layer (17 of the
    21 layers' shapes are distinct; the policy is a function of the problem and target)."""
    seen = set()
    for model, layers in SHAPES["models"].items():
        for layer, nk in layers.items():
            for M in SHAPES["m_decode"] + SHAPES["m_prefill"]:
                if (M, nk["N"], nk["K"]) not in seen:
                    seen.add((M, nk["N"], nk["K"]))
                    yield f"{model}.{layer}.M{M}", GemmProblem(M=M, N=nk["N"], K=nk["K"], dtype="bf16",
                                                               layout_b="col")


_CANDIDATES: dict[tuple, list] = {}


def llm_candidates(target) -> list[tuple[str, GemmProblem, list]]:
    """(name, problem, candidates) for every LLM shape on ``target``, computed once per process
    and settings: the legality, decode and roofline tests below ask the policy the same ~250
    questions per target (CI time; candidates are frozen, so sharing them is safe)."""
    key = (target.name, json.dumps(tilewright.config.as_dict(), sort_keys=True, default=str))
    if key not in _CANDIDATES:
        policy = policy_for("gemm", target)
        _CANDIDATES[key] = [(name, p, policy.candidates(p, target)) for name, p in llm_problems()]
    return _CANDIDATES[key]


@pytest.mark.parametrize("target_name", ["cuda:sm_90a", "cuda:sm_100a", "hip:gfx950", "cpu"])
def test_candidates_are_legal_clamped_and_bounded(target_name):
    target = get_target(target_name)
    if target.interpreted:  # interpreted kernels are proposed only when forced
        with tilewright.config.patch(force_backend="triton"):
            _check_candidates(target)
    else:
        _check_candidates(target)


def _check_candidates(target):
    for name, p, cands in llm_candidates(target):
        assert cands[0].template_id == "aten.gemm" and cands[0].rank == 0, name
        gen = cands[1:]
        assert 1 <= len(gen) <= tilewright.config.max_candidates, name
        for c in gen:
            params = c.param_dict
            tmpl = get_template(c.template_id)
            assert tmpl.check(params, p, target) is None, (name, params)
            # clamped to the kernel's problem (transposed under swap-AB), down to the smallest
            # tile the template has (64-row MMAs for the CuTeDSL templates)
            kp = p.transposed() if params.get("SWAP_AB") else p
            smallest = min(tmpl.space.knob("BLOCK_M").values)
            assert params["BLOCK_M"] <= max(16, smallest, 1 << (kp.M - 1).bit_length()), (name, params)
        preds = [c.predicted_ms for c in gen]
        assert preds == sorted(preds), f"{name}: generated candidates not ranked by prediction"


def test_decode_gets_thin_tiles():
    target = get_target("cuda:sm_90a")
    p = GemmProblem(M=1, N=4096, K=4096, dtype="bf16", layout_b="col")
    gen = policy_for("gemm", target).candidates(p, target)[1:]
    for c in gen:  # the token dim gets 16 rows (or 16 columns, swapped)
        if c.backend != "triton":
            continue  # CuTeDSL MMAs are 64 rows at least
        d = c.param_dict
        assert (d["BLOCK_N"] if d.get("SWAP_AB") else d["BLOCK_M"]) == 16, c.name


@pytest.mark.parametrize("target_name", ["cuda:sm_90a", "cuda:sm_100a", "hip:gfx950"])
def test_decode_policy_budget_and_remedies(target_name):
    """Every decode shape of the LLM table: at most the budget, swap-AB where N >> M, split-K
    where too few tiles would leave SMs idle on a long K."""
    from tilewright.autotune.decode import decode_variants, wants_split_k, wants_swap_ab
    from tilewright.templates import get_template

    target = get_target(target_name)
    pointer = get_template("triton.gemm")

    def only_spilling(p, remedy) -> bool:
        """Every setting of the remedy is refused for its registers (a refusal calibrated on AOT
        builds: the pointer GEMM's B (N, K) fragments spill on NVIDIA, templates/triton/registers.py)."""
        settings = [v for v in decode_variants(p, target, set(pointer.space.names())) if remedy(v)]
        reasons = [pointer.check({**pointer.space.default(), **v}, p, target) for v in settings]
        return bool(settings) and all(r and ("spill" in r or "registers" in r) for r in reasons)

    for name, p, cands in llm_candidates(target):
        if p.M > 64:
            continue
        gen = cands[1:]
        assert len(gen) <= tilewright.config.max_candidates, name
        swapped = [c for c in gen if c.param_dict.get("SWAP_AB")]
        split = [c for c in gen if c.param_dict.get("SPLIT_K", 1) > 1]
        if wants_swap_ab(p) and not only_spilling(p, lambda v: v["SWAP_AB"]):
            assert swapped, f"{name}: N={p.N} >> M={p.M} but no swap-AB candidate"
        thin = min(64, max(16, 1 << (p.M - 1).bit_length()))
        if wants_split_k(p, target, thin, 128) and not wants_swap_ab(p) \
                and not only_spilling(p, lambda v: v["SPLIT_K"] > 1):
            assert split, f"{name}: few tiles on K={p.K} but no split-K candidate"
        if split:
            assert p.K >= 1024


def test_interpreter_policy_prefers_big_tiles():
    target = get_target("cpu")
    p = GemmProblem(M=256, N=256, K=256, dtype="fp32")
    with tilewright.config.patch(force_backend="triton"):
        first = policy_for("gemm", target).candidates(p, target)[1].param_dict
    assert (first["BLOCK_M"], first["BLOCK_N"], first["BLOCK_K"]) == (128, 128, 128)


def test_max_candidates_setting_bounds_the_list():
    target = get_target("cuda:sm_90a")
    p = GemmProblem(M=4096, N=4096, K=4096, dtype="bf16")
    with tilewright.config.patch(max_candidates=2):
        assert len(policy_for("gemm", target).candidates(p, target)) == 3


def test_cost_model_never_beats_roofline():
    for tname in ("cuda:sm_90a", "cuda:sm_100a", "hip:gfx942", "hip:gfx950", "hip:gfx1250"):
        target = get_target(tname)
        for _, p, cands in llm_candidates(target):
            for c in cands[1:]:
                assert estimate_gemm(p, c.param_dict, target).ms >= roofline_ms(p, target)


def test_targets_without_a_tile_table_get_aten_first_then_their_templates_own_settings():
    # mps has no GEMM seed table: ATen leads, the Metal GEMM proposes its own tiles (seed_params)
    target = get_target("mps")
    cands = policy_for("gemm", target).candidates(GemmProblem(M=64, N=64, K=64, dtype="fp32"), target)
    assert cands[0].template_id == "aten.gemm"
    assert {c.template_id for c in cands[1:]} == {"metal.gemm"}


def test_interpreted_kernels_compete_only_when_forced():
    """Regression: on a loaded CPU, ATen's threads stalled during timing and an interpreted
    kernel won, and stayed cached: a 170x slower GEMM."""
    target = get_target("cpu")
    p = GemmProblem(M=64, N=64, K=64, dtype="fp32")
    assert [c.template_id for c in policy_for("gemm", target).candidates(p, target)] == ["aten.gemm"]
    with tilewright.config.patch(force_backend="triton"):
        assert len(policy_for("gemm", target).candidates(p, target)) > 1
