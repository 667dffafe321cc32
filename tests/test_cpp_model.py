"""A whole model on the C++ loop kernels: the demo's Llama decoder (2 layers, hidden 128; 1x8
tokens) compiled with ``force_backend="cpp"`` (every loop kernel a ``cpp.*`` template, GEMMs on
ATen), one training step (forward, loss, backward) and a bf16 inference compared with eager by
‖out − ref‖ / ‖ref‖; the reports say which loop kernels ran as C++.

The compiled model is built once per module and shared by the asserts; each distinct loop
kernel is one g++ build (~0.6 s), cached by hash for the session.
"""

from __future__ import annotations

import copy

import pytest
import torch

import tilewright
from conftest import TOL, rel_err
from tilewright.compiler.report import collect_reports
from tilewright.runtime import cpp as runtime

MISSING = runtime.unavailable_reason()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=f"no C++ compiler: {MISSING}")
# tuning kept short: the kernels are checked against float64 once, not timed at length
FORCED = dict(force_backend="cpp", strict=True, bench_rep=1, bench_min_rep=1, bench_warmup=0, bench_budget_ms=0.0)


def _loop_winners(graphs) -> list[tuple[str, str, str]]:
    """(kind, winner, reason) of every kernel C++ must run: every loop kernel, scans and
    scatters included (the embedding's backward is a scatter); attention has its own template."""
    return [(k.kind, k.winner, k.reason) for g in graphs for k in g.kernels if k.kind != "attention"]


@pytest.fixture(scope="module")
def llama_step():
    """One training step of the demo's Llama decoder, eager and compiled with C++ loop kernels."""
    from tilewright.demo import models

    torch._dynamo.reset()
    eager = models.build_llama(torch.float32)
    model = copy.deepcopy(eager)
    ids = models.llama_inputs(batch=1, seq=8)
    ref = eager(input_ids=ids, labels=ids)
    ref.loss.backward()
    with tilewright.config.patch(**FORCED), collect_reports() as graphs:
        out = torch.compile(model, backend="tilewright")(input_ids=ids, labels=ids)
        out.loss.backward()
    torch._dynamo.reset()
    return eager, model, ref, out, list(graphs)


def test_llama_loop_kernels_run_as_cpp(llama_step):
    *_, graphs = llama_step
    assert [g.kind for g in graphs] == ["forward", "backward"] and not any(g.fallback for g in graphs)
    winners = _loop_winners(graphs)
    assert winners and all(w.startswith("cpp.") for _, w, _ in winners), [w for w in winners if not w[1].startswith("cpp.")]
    assert {kind for kind, _, _ in winners} == {"pointwise", "reduction"}


def test_llama_forward_matches_eager(llama_step):
    _, _, ref, out, _ = llama_step
    assert rel_err(out.logits, ref.logits) <= TOL[torch.float32]
    assert rel_err(out.loss, ref.loss) <= TOL[torch.float32]


def test_llama_training_step_gradients_match_eager(llama_step):
    eager, model, *_ = llama_step
    worst = 0.0
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        assert p.grad is not None, name
        worst = max(worst, rel_err(p.grad, q.grad))
    assert worst <= TOL[torch.float32], worst


def test_bf16_llama_inference_matches_eager_within_bf16():
    from tilewright.demo import models

    torch._dynamo.reset()
    model = models.build_llama(torch.bfloat16)
    ids = models.llama_inputs(batch=1, seq=8)
    exact = copy.deepcopy(model).double()
    with torch.no_grad():
        ref = exact(input_ids=ids).logits
        eager = model(input_ids=ids).logits
        with tilewright.config.patch(**FORCED), collect_reports() as graphs:
            out = torch.compile(model, backend="tilewright")(input_ids=ids).logits
    torch._dynamo.reset()
    assert len(graphs) == 1, "one graph for every size (symbolic sizes)"
    winners = _loop_winners(graphs)
    assert winners and all(w.startswith("cpp.") for _, w, _ in winners), winners
    # as close to float64 as eager bf16 is (eager rounds every op; the kernels once per store)
    assert rel_err(out, ref) <= max(TOL[torch.bfloat16], 1.2 * rel_err(eager, ref))


def test_dynamic_shapes_run_the_size_generic_kernels_at_every_size():
    """Kernels of a graph traced with symbolic sizes take the sizes as arguments: one compiled
    function, rows of several lengths and counts (ragged against the 16 lanes), all correct."""
    import torch.nn.functional as F

    def fn(x, w):
        return F.rms_norm(x, (x.shape[-1],), w, eps=1e-6).softmax(-1) * 2 + x.sum(-1, keepdim=True)

    torch._dynamo.reset()
    with tilewright.config.patch(**FORCED), collect_reports() as graphs:
        compiled = torch.compile(fn, backend="tilewright", dynamic=True)
        for rows, cols in ((5, 37), (9, 70), (3, 16), (2, 300)):
            x, w = torch.randn(rows, cols), torch.randn(cols)
            out = compiled(x, w)
            ref = fn(x.double(), w.double())
            assert rel_err(out, ref) <= TOL[torch.float32], (rows, cols)
    torch._dynamo.reset()
    assert len(graphs) == 1, "one graph for every size (symbolic sizes)"
    winners = _loop_winners(graphs)
    assert winners and all(w.startswith("cpp.") for _, w, _ in winners), winners
