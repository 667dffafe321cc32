"""Helion templates on a GPU (marker gpu; bench/device_check.sh runs them): residual RMSNorm,
softmax and a GEMM with bias and GELU, each forced to Helion, JIT-compiled from Helion's Triton,
checked against float64 with poisoned outputs by the tuner and timed; and a compiled model
forced to Helion against float64. What this machine cannot prove: numerics of compiled (not
interpreted) Helion kernels and their speed."""

from __future__ import annotations

import pytest
import torch
from torch import nn

try:  # a helion that is there but does not import with this torch skips too (1.5.1 on 2.11)
    import helion  # noqa: F401
except ImportError as e:
    pytest.skip(f"helion does not import here: {e}", allow_module_level=True)

import tilewright  # noqa: E402
from tilewright.autotune.cache import TuningCache  # noqa: E402
from tilewright.autotune.select import select  # noqa: E402
from tilewright.compiler import aot  # noqa: E402
from tilewright.compiler.capture import ModelSpec  # noqa: E402
from tilewright.compiler.report import collect_reports  # noqa: E402
from tilewright.compiler.kernel_factory import default_factory  # noqa: E402
from tilewright.runtime.targets import detect_target  # noqa: E402

pytestmark = pytest.mark.gpu


class Block(nn.Module):
    def __init__(self, d: int, f: int):
        super().__init__()
        self.norm = nn.RMSNorm(d, eps=1e-5)
        self.up = nn.Linear(d, f)

    def forward(self, x, res):
        h = x + res
        return torch.softmax(nn.functional.gelu(self.up(self.norm(h))), -1), h


@pytest.mark.parametrize("rows", [1000, 4096])
def test_helion_templates_are_checked_and_timed_on_the_gpu(tmp_path, rows):
    target = detect_target(torch.device("cuda"))
    x = torch.randn(rows, 1024, dtype=torch.bfloat16, device="cuda")
    spec = ModelSpec(Block(1024, 2048).to(torch.bfloat16).cuda(), (x, torch.randn_like(x)), {}, "block")
    problems = [c.problem for c in aot.capture_kernels(spec)]
    assert len(problems) == 3
    for problem in problems:
        with tilewright.config.patch(force_backend="helion", max_candidates=3):
            sel = select(problem, target, default_factory, cache=TuningCache(tmp_path / "tuning.json"))
        assert sel.measured and sel.winner.template_id.startswith("helion."), (problem.describe(), sel.reason)
        assert sel.winner_record.status == "ok" and sel.winner_record.median_ms > 0


def test_a_model_forced_to_helion_matches_float64_on_the_gpu(tmp_path):
    torch.manual_seed(0)
    model = Block(512, 768).to(torch.bfloat16).cuda()
    x = torch.randn(300, 512, dtype=torch.bfloat16, device="cuda")  # ragged rows
    r = torch.randn_like(x)
    with torch.no_grad(), collect_reports() as reports, tilewright.config.patch(
            force_backend="helion", cache_dir=str(tmp_path), max_candidates=2):
        out, h = torch.compile(model, backend="tilewright")(x, r)
    ref = Block(512, 768).double().cuda()
    ref.load_state_dict(model.state_dict())
    with torch.no_grad():
        eo, eh = ref(x.double(), r.double())
    assert ((out.double() - eo).norm() / eo.norm()).item() < 2e-2
    assert ((h.double() - eh).norm() / eh.norm()).item() < 1e-2
    winners = [g.winner for rep in reports for g in rep.gemms] + [k.winner for rep in reports for k in rep.kernels]
    assert winners and all(w.startswith("helion.") for w in winners), winners
