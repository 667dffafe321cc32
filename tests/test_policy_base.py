"""The one candidates() skeleton every policy shares (tilewright.autotune.policy_base)."""

from __future__ import annotations

from typing import Any

import pytest

import tilewright
from tilewright.autotune.policy_base import CandidatePolicy
from tilewright.kinds import kinds
from tilewright.runtime.targets import get_target
from tilewright.templates import Knob, ParamSpace, Support


class _Template:
    """Just what a policy asks of a template."""

    backend = "triton"
    space = ParamSpace((Knob("XBLOCK", (64, 256, 1024), 1024, ""), Knob("num_warps", (1, 2, 4), 4, "")))

    def __init__(self, tid: str, seeds: list[dict], ok: bool = True):
        self.id, self.source_hash, self._seeds, self._ok = tid, tid[-4:], seeds, ok

    def seed_params(self, problem: Any, target: Any) -> list[dict]:
        return self._seeds

    def supports(self, problem: Any, target: Any) -> Support:
        return Support(self._ok, "" if self._ok else "no")

    def check(self, params: dict, problem: Any, target: Any) -> str | None:
        return "too big" if params["XBLOCK"] == 64 else None


class _Policy(CandidatePolicy):
    max_candidates = 3

    def estimate(self, problem, params, target, template):
        return 1024 / params["XBLOCK"] + params["num_warps"]

    def head(self, problem, target):
        from tilewright.autotune.candidates import Candidate

        return [Candidate.of("aten.toy", "0", {}, rank=0)]


def test_skeleton_ranks_aten_first_then_the_fastest_legal_settings_within_the_budget():
    a = _Template("triton.a", [{"XBLOCK": 256}, {"XBLOCK": 64}, {"XBLOCK": 256}, {"XBLOCK": 1024, "num_warps": 1}])
    b = _Template("triton.b", [{"XBLOCK": 1024, "num_warps": 2}, {"XBLOCK": 256, "num_warps": 1}])
    refused = _Template("triton.c", [{"XBLOCK": 1024, "num_warps": 1}], ok=False)
    gpu = get_target("cuda:sm_90a")
    cands = _Policy().candidates(object(), gpu, templates=[a, b, refused])
    # XBLOCK=64 fails check, the duplicate 256 is dropped, c does not support the problem
    assert [(c.template_id, c.param_dict["XBLOCK"], c.param_dict["num_warps"]) for c in cands[1:]] == [
        ("triton.a", 1024, 1), ("triton.b", 1024, 2), ("triton.b", 256, 1)]
    assert cands[0].template_id == "aten.toy" and [c.rank for c in cands] == [0, 1, 2, 3]
    assert [c.predicted_ms for c in cands[1:]] == [2.0, 3.0, 5.0]
    assert _Policy().ranked(object(), gpu, a) == [(2.0, {"XBLOCK": 1024, "num_warps": 1}),
                                                  (8.0, {"XBLOCK": 256, "num_warps": 4})]
    # an interpreted target in auto mode: ATen alone, unless the policy says otherwise
    cpu = get_target("cpu")
    assert [c.template_id for c in _Policy().candidates(object(), cpu, templates=[a])] == ["aten.toy"]
    with tilewright.config.patch(force_backend="triton"):
        assert len(_Policy().candidates(object(), cpu, templates=[a])) == 3


@pytest.mark.parametrize("kind", [k for k in kinds()], ids=lambda k: k.name)
def test_every_builtin_policy_is_the_shared_skeleton(kind):
    """Each built-in kind's policy subclasses the base; its candidates start with ATen at rank 0
    and rise in rank, within the budget."""
    gpu = get_target("cuda:sm_90a")
    for name in kind.names:
        policy = kind.policy(name, gpu)
        assert isinstance(policy, CandidatePolicy), f"{name}: {type(policy).__name__}"
        problem = next(p for p in kind.examples() if p.kind == name)
        cands = policy.candidates(problem, gpu)
        ranks = [c.rank for c in cands]
        assert cands[0].template_id.startswith("aten.") and ranks == sorted(set(ranks))
        assert len([c for c in cands if not c.template_id.startswith("aten.")]) <= policy.budget()


def test_every_kind_pins_the_knobs_its_templates_compiler_needs_on_the_backend():
    """Triton's AMD pipeliner wants 2 stages (``Language.pinned_knobs``): the shared skeleton
    pins it for every kind's Triton candidates on gfx950, not only the GEMM policy's."""
    from tilewright.kinds.grouped_gemm.policy import GroupedGemmPolicy
    from tilewright.kinds.grouped_gemm.problem import GroupedGemmProblem

    moe = GroupedGemmProblem(case="2d3d", G=8, M=1000, N=256, K=256, dtype="bf16", layout_b="col")
    with tilewright.config.patch(force_backend="triton"):
        for name, want in (("hip:gfx950", {2}), ("cuda:sm_90a", None)):
            cands = GroupedGemmPolicy().candidates(moe, get_target(name))
            stages = {c.param_dict["num_stages"] for c in cands if c.template_id.startswith("triton.")}
            assert stages, name
            assert stages == want if want else stages - {2}, (name, stages)
