"""Attention on a CUDA GPU: each template compiled for the device (with and without tensor
descriptors) against float64, and compiled models (an SDPA block, FlexAttention with a block
mask and a score_mod, forward and backward: torch runs flex's backward on a GPU) with generated
kernels forced. Skipped without CUDA; bench/device_check.sh runs it."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import tilewright
from tilewright.attention import AttentionProblem, BlockMaskSpec, mods, tuning
from tilewright.compiler.report import collect_reports
from tilewright.ir import expr as E

pytestmark = pytest.mark.gpu


@pytest.fixture
def target():
    from tilewright.runtime.targets import detect_target

    return detect_target("cuda")


def _problems():
    softcap = mods.dumps(30.0 * E.op("tanh", mods.score() / 30.0))
    common = dict(B=2, H=8, H_kv=2, D=128, Dv=128, dtype="bf16", scale=128 ** -0.5)
    return [
        ("triton.attention", AttentionProblem(Sq=333, Skv=333, causal=True, empty_lse=0.0, **common)),
        ("triton.attention", AttentionProblem(Sq=256, Skv=256, mask_mod=mods.dumps(mods.sliding_window(64)),
                                              score_mod=softcap, block_mask=BlockMaskSpec(128, 128), lse_base="2",
                                              **common)),
        ("triton.attention_decode", AttentionProblem(Sq=1, Skv=4097, **common)),
        ("triton.attention_bwd", AttentionProblem(Sq=300, Skv=300, causal=True, direction="backward",
                                                  empty_lse=0.0, **common)),
    ]


@pytest.mark.parametrize("case", range(4))
@pytest.mark.parametrize("desc", [False, True])
def test_attention_templates_match_float64_on_the_gpu(target, case, desc):
    from tilewright.autotune.attention_policy import AttentionPolicy
    from tilewright.compiler.kernel_factory import default_factory
    from tilewright.templates import get_template

    template_id, problem = _problems()[case]
    template = get_template(template_id)
    ranked = [p for _, p in AttentionPolicy().ranked(problem, target, template) if bool(p["DESC"]) == desc]
    if not ranked:
        pytest.skip(f"no {'descriptor ' if desc else ''}tile on {target.name}")
    launch = default_factory.compile(template.render(problem, ranked[0], target))
    x = tuning.make_inputs(problem, "cuda", seed=1)
    result = tuning.run(launch, x, tuning.poisoned(problem, "cuda"))
    err, tol = tuning.error(problem, result, tuning.reference(problem, x), False)
    assert err <= tol, f"{template_id} {ranked[0]}: {err} > {tol}"


def test_sdpa_training_step_on_the_gpu_through_generated_kernels():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 8, 200, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    with tilewright.config.patch(force_backend="triton"), collect_reports() as reports:
        out = torch.compile(f, backend="tilewright")(q, k, v)
        out.float().square().sum().backward()
    assert sum(k.kind == "attention" for r in reports for k in r.kernels) == 2
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    want = f(qd, kd, vd)
    want.square().sum().backward()
    assert (out.double() - want).norm() / want.norm() < 2e-2
    for got, ref in ((q.grad, qd.grad), (k.grad, kd.grad), (v.grad, vd.grad)):
        assert (got.double() - ref).norm() / ref.norm() < 3e-2


def test_flex_attention_forward_and_backward_on_the_gpu():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    B, H, S, D = 2, 4, 300, 64
    doc = (torch.arange(S, device="cuda") // 90)

    def mask_mod(b, h, m, n):
        return (m >= n) & (doc[m] == doc[n])

    def score_mod(s, b, h, m, n):
        return 20 * torch.tanh(s / 20)

    bm = create_block_mask(mask_mod, B, None, S, S, device="cuda", BLOCK_SIZE=128)
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))

    def f(q, k, v):
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=bm)

    with tilewright.config.patch(force_backend="triton"), collect_reports() as reports:
        out = torch.compile(f, backend="tilewright")(q, k, v)
        out.float().square().sum().backward()
    assert sum(k.kind == "attention" and k.winner.startswith("triton") for r in reports for k in r.kernels) == 2
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    s = 20 * torch.tanh(qd @ kd.transpose(-1, -2) * D ** -0.5 / 20)
    m, n = torch.arange(S, device="cuda")[:, None], torch.arange(S, device="cuda")[None]
    s = s.masked_fill(~((m >= n) & (doc[m] == doc[n])), -math.inf)
    want = torch.softmax(s, -1) @ vd
    want.square().sum().backward()
    assert (out.double() - want).norm() / want.norm() < 2e-2
    for got, ref in ((q.grad, qd.grad), (k.grad, kd.grad), (v.grad, vd.grad)):
        assert (got.double() - ref).norm() / ref.norm() < 3e-2
