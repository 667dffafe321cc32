"""What a compiled training step calls per step on a CPU (issue 20: the demo training steps
were slower than eager): ``t(t(x))`` is folded before lowering, the wrapper writes views as
tensor methods and other ops through their C++ entry, and a scatter fused with the ops around
it keeps an ATen program the tuner can choose (the torch form of a scatter kernel cost ~200 us
where eager's ops cost ~20). Every result is checked against float64."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from torch.fx.experimental.proxy_tensor import make_fx

import tilewright
from conftest import rel_err
from tilewright.compiler.report import collect_reports
from tilewright.compiler.views import fold_double_transposes

sys.path.insert(0, str(Path(__file__).parent))
from test_cpu_fast import g, problems_of, program_params, run_candidate  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _t_nodes(gm) -> int:
    return sum(1 for n in gm.graph.nodes if n.target is torch.ops.aten.t.default)


# -- transposes of transposes ------------------------------------------------------------------------
def test_double_transposes_fold_to_their_source_with_the_same_values():
    def fn(x, w):
        return x @ w.t().t() + (x @ w).t().t()

    x, w = g(5, 7), g(7, 7, seed=1)
    gm = make_fx(fn)(x, w)
    assert _t_nodes(gm) == 4
    assert fold_double_transposes(gm) == 2
    assert _t_nodes(gm) == 0
    ref = fn(x.double(), w.double())
    assert rel_err(gm(x, w), ref) < 1e-6


def test_a_double_transpose_of_an_input_returned_as_output_stays_a_view():
    # aot_autograd recorded that output as a view of the input: it must not become the input
    gm = make_fx(lambda w: w.t().t())(g(3, 4))
    assert fold_double_transposes(gm) == 0 and _t_nodes(gm) == 2


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(12, 24)
        self.down = nn.Linear(24, 12, bias=False)

    def forward(self, x):
        return self.down(torch.relu(self.up(x))).square().mean()


def _backward_wrapper(debug_dir: Path) -> str:
    (path,) = Path(debug_dir).rglob("graph_*_backward/wrapper.py")
    return path.read_text()


def test_a_training_step_calls_views_as_methods_and_folds_transposes(tmp_path, fresh_cache):
    torch.manual_seed(0)
    model = MLP()
    ref = MLP().double()
    ref.load_state_dict(model.state_dict())
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="tilewright")
    with tilewright.config.patch(debug_dir=str(tmp_path), graph_race="off"):
        for step in range(3):  # fresh inputs every step; gradients accumulate as eager's do
            x = torch.randn(6, 12)
            loss = compiled(x)
            loss.backward()
            ref(x.double()).backward()
            assert rel_err(loss, ref(x.double())) < 1e-5
            for p, q in zip(model.parameters(), ref.parameters()):
                assert rel_err(p.grad, q.grad) < 1e-5, step
    source = _backward_wrapper(tmp_path)
    body = source.split("def call(args):")[1]
    assert "aten.t.default(" not in body and "aten.view.default(" not in body
    # no transpose of a transpose is left: each `.t()` reads a value that is not one itself
    transposed = set(re.findall(r"(\w+) = \w+\.t\(\)", body))
    assert not any(re.search(rf"= {v}\.t\(\)", body) for v in transposed), body


# -- scatters fused with the ops around them keep an ATen program ------------------------------------
def _programs_are_right(fn, *args) -> int:
    """Checks every loop kernel of ``fn`` has a program that matches float64 (outputs
    poisoned, the buffers a scatter adds into random); returns how many kernels there are."""
    problems = problems_of(fn, *args)
    for p in problems:
        assert p.unfused, p.describe()
        _, _, got, ref = run_candidate(p, f"aten.unfused_{p.kind}", program_params(p))
        for a, b in zip(got, ref):
            assert rel_err(a, b) < 1e-5, p.describe()
    return len(problems)


def test_an_embedding_backward_fused_with_a_reduction_adds_into_its_buffer():
    # the Llama's backward fuses the embedding's gradient with the last norm's: the program
    # started from zeros of its own and dropped what the kernel's buffer held (error 0.91)
    def fn(grad, ids, w):
        h = grad * w
        return h.sum((0, 1)), torch.ops.aten.embedding_dense_backward(h, ids, 32, -1, False)

    assert _programs_are_right(fn, g(2, 5, 16), torch.randint(0, 32, (2, 5)), g(16, seed=1)) >= 1


def test_moe_style_index_puts_into_zeros_get_programs():
    # a Qwen3-MoE backward: index_put into new_zeros, whose zeros are a buffer another kernel
    # writes; such kernels had no program (or a wrong one) and ran as the slow torch form
    def fn(v, idx, idx2, u):
        a = v.new_zeros(10, 8).index_put((idx,), v.exp(), accumulate=True)
        return a.new_zeros(6, 8).index_put((idx2,), a[:9] * u, accumulate=True)

    args = (g(12, 8), torch.randint(0, 10, (12,)), torch.randint(0, 6, (9,)), g(9, 8, seed=2))
    assert _programs_are_right(fn, *args) >= 2


def test_a_compiled_model_with_an_embedding_trains_right_on_the_programs(fresh_cache):
    # the embedding's gradient written in place into its zeros buffer (the wrapper passes that
    # buffer as the kernel's output), on ATen's candidates only so the programs can win
    class Emb(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(40, 16)
            self.norm = nn.RMSNorm(16)
            self.out = nn.Linear(16, 40)

        def forward(self, ids):
            return nn.functional.cross_entropy(self.out(self.norm(self.emb(ids))).flatten(0, 1), ids.flatten())

    torch.manual_seed(0)
    model = Emb()
    ref = Emb().double()
    ref.load_state_dict(model.state_dict())
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="tilewright")
    with tilewright.config.patch(force_backend="aten", graph_race="off"), collect_reports() as reports:
        for _ in range(3):
            ids = torch.randint(0, 40, (3, 7))  # repeats: rows accumulate
            compiled(ids).backward()
            ref(ids).backward()
            for p, q in zip(model.parameters(), ref.parameters()):
                assert rel_err(p.grad, q.grad) < 1e-5
    winners = [k.winner for r in reports for k in r.kernels if "embedding_dense_backward" in k.op]
    assert winners, [k.op for r in reports for k in r.kernels]
