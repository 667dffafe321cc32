"""Attention and loop kernels with symbolic sizes (``dynamic=True``, ``mark_dynamic``, Dynamo's
automatic dynamic after a size change): SDPA with masks and GQA, flex_attention decode over a
growing KV length with a block mask built outside the graph, hand-written attention; finfo.min
and -inf rows (5-D inputs and a float mask requiring grad: tests/test_attention_masks.py); tuning
inputs of a new bucket valid for the graph's own bounds. Judged against float64 (or against
eager where eager's convention is the point), with the graph reports showing generated kernels."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

import tilewright
from tilewright.compiler.report import collect_reports

TOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 2e-2}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    o, r = out.detach().double(), ref.detach().double()
    return ((o - r).norm() / r.norm().clamp_min(1e-30)).item()


def _attention_kernels(reports):
    return [k for r in reports for k in r.kernels if k.kind == "attention"]


def _aten_ops(reports) -> int:
    return sum(r.extern_ops for r in reports)


def _sdpa64(q, k, v, mask=None, causal=False):
    q, k, v = q.double(), k.double(), v.double()
    if k.shape[1] != q.shape[1]:
        g = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s + mask.double() if mask.dtype != torch.bool else s.masked_fill(~mask, -math.inf)
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).tril().logical_not(), -math.inf)
    return torch.softmax(s, -1) @ v


def test_sdpa_under_dynamic_true_runs_generated_kernels_at_every_length():
    """Masked and causal GQA SDPA compiled with dynamic=True: one graph each, generated
    attention kernels with symbolic lengths and batch (the mask follows them), float64-right at
    lengths across buckets. Before: 'a dynamic head count' / 'a mask with dynamic sizes' kept
    them ATen calls."""
    def masked(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

    def causal_gqa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    torch.manual_seed(0)
    with tilewright.config.patch(force_backend="triton"), collect_reports() as reports:
        cm = torch.compile(masked, backend="tilewright", dynamic=True)
        cg = torch.compile(causal_gqa, backend="tilewright", dynamic=True)
        for B, S in ((3, 8), (5, 21)):
            q = torch.randn(B, 4, S, 16)
            k, v = torch.randn(B, 4, S + 2, 16), torch.randn(B, 4, S + 2, 16)
            m = torch.randn(B, 1, S, S + 2)
            assert rel_err(cm(q, k, v, m), _sdpa64(q, k, v, m)) < TOL[torch.float32]
            k2, v2 = torch.randn(B, 2, S, 16), torch.randn(B, 2, S, 16)
            assert rel_err(cg(q, k2, v2), _sdpa64(q, k2, v2, causal=True)) < TOL[torch.float32]
    assert len(reports) == 2, [r.graph_id for r in reports]  # no recompile per length
    kernels = _attention_kernels(reports)
    assert len(kernels) == 2 and all(k.winner.startswith("triton.attention") for k in kernels)
    assert all("dynamic" in k.problem and "Sq" in k.problem for k in kernels), [k.problem for k in kernels]
    assert _aten_ops(reports) == 0


def test_sdpa_with_mark_dynamic_lengths_is_one_generated_kernel_for_every_length():
    """Lengths marked dynamic up front (``torch._dynamo.mark_dynamic``), a boolean mask over
    them: one graph, one dynamic attention kernel, right at each length."""
    def f(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

    torch.manual_seed(7)
    with tilewright.config.patch(force_backend="triton"), collect_reports() as reports:
        cf = torch.compile(f, backend="tilewright")
        for S in (9, 30):
            q, k, v = (torch.randn(2, 4, S, 16) for _ in range(3))
            m = torch.rand(S, S) < 0.8
            m[:, 0] = True
            for t, d in ((q, 2), (k, 2), (v, 2), (m, 0), (m, 1)):
                torch._dynamo.mark_dynamic(t, d)
            assert rel_err(cf(q, k, v, m), _sdpa64(q, k, v, m)) < TOL[torch.float32]
    kernels = _attention_kernels(reports)
    assert len(reports) == 1 and len(kernels) == 1 and "dynamic Skv,Sq" in kernels[0].problem, \
        [k.problem for k in kernels]


def test_sdpa_backward_after_an_automatic_dynamic_length_change():
    """Training SDPA with a mask: Dynamo makes the length dynamic at the second size; forward
    and backward of that graph are generated attention kernels, gradients float64-right."""
    torch.manual_seed(1)

    def f(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=False)

    with tilewright.config.patch(force_backend="triton"), collect_reports() as reports:
        cf = torch.compile(f, backend="tilewright")
        for S in (8, 12, 19):
            q, k, v = (torch.randn(2, 3, S, 16, requires_grad=True) for _ in range(3))
            m = torch.randn(1, 1, S, S)
            go = torch.randn(2, 3, S, 16)
            grads = torch.autograd.grad(cf(q, k, v, m), (q, k, v), go)
            q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
            want = torch.autograd.grad(_sdpa64(q64, k64, v64, m), (q64, k64, v64), go.double())
            for g, w in zip(grads, want):
                assert rel_err(g, w) < TOL[torch.float32]
    dyn = [k for k in _attention_kernels(reports) if "dynamic" in k.problem]
    assert sorted(k.problem.split()[1] for k in dyn) == ["backward", "forward"], [k.problem for k in dyn]
    assert _aten_ops(reports) == 0


def test_flex_decode_over_a_growing_kv_length_with_an_outside_block_mask():
    """flex_attention decode (one query) as the KV length grows, the block mask built outside
    the graph each step and a score_mod reading a captured table: every graph's attention is a
    generated kernel; the dynamic one (symbolic block sizes, lengths) is right at each length,
    and past the table's end it raises eager's IndexError (its check of bias[n])."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch.manual_seed(2)
    bias = torch.randn(64)

    def f(q, k, v, bm):
        return flex_attention(q, k, v, score_mod=lambda s, b, h, m, n: s + bias[n], block_mask=bm)

    def window(b, h, m, n):
        return n >= 4

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # flex's eager reference
        with tilewright.config.patch(force_backend="triton"), collect_reports() as reports:
            cf = torch.compile(f, backend="tilewright")
            for S in (16, 24, 40, 47):
                q, k, v = torch.randn(1, 2, 1, 16), torch.randn(1, 2, S, 16), torch.randn(1, 2, S, 16)
                bm = create_block_mask(window, 1, 1, 1, S, device="cpu", BLOCK_SIZE=16)
                s = (q.double() @ k.double().transpose(-1, -2)) / 4.0 + bias[:S].double()
                s[..., :4] = -math.inf
                assert rel_err(cf(q, k, v, bm), torch.softmax(s, -1) @ v.double()) < TOL[torch.float32]
            # past the table's 64 entries eager raises, and so does the compiled graph
            q, k, v = torch.randn(1, 2, 1, 16), torch.randn(1, 2, 80, 16), torch.randn(1, 2, 80, 16)
            bm = create_block_mask(window, 1, 1, 1, 80, device="cpu", BLOCK_SIZE=16)
            with pytest.raises(IndexError):
                cf(q, k, v, bm)
    kernels = _attention_kernels(reports)
    dynamic = [k for k in kernels if "dynamic Skv" in k.problem]
    # bias[n] over a symbolic Skv is not proven inside the table: the generated kernel checks it
    # on its live lanes (it had refused the problem, leaving the dynamic graph ATen's attention)
    assert dynamic and all(k.winner.startswith("triton.attention") for k in kernels), [k.winner for k in kernels]
    assert all(not r.kernel_fallbacks and r.fallback is None for r in reports)


@pytest.fixture
def flex_backward_on_cpu(monkeypatch):
    """torch's ``flex_attention`` refuses inputs that require grad on a CPU in its Python
    wrapper, before tracing (its own backward has no CPU kernel); the compiled graph's forward
    and backward run tilewright's kernels (the Triton interpreter), so the check is lifted."""
    import torch.nn.attention.flex_attention as fa

    monkeypatch.setattr(fa, "_validate_device", lambda *args, **kwargs: None, raising=False)


@pytest.mark.parametrize("mode", [pytest.param("automatic", marks=pytest.mark.slow), "dynamic=True"])
def test_flex_backward_with_symbolic_sizes(flex_backward_on_cpu, mode):
    """flex_attention training (GQA, an ALiBi score_mod reading captured slopes, a causal block
    mask built outside the graph) at growing lengths: the graph Dynamo makes dynamic (after a
    length change, or from the first call under dynamic=True) runs generated forward and
    backward attention kernels with symbolic lengths, gradients float64-right at every size."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch.manual_seed(8)
    slopes = torch.rand(4)

    def f(q, k, v, bm):
        return flex_attention(q, k, v, score_mod=lambda s, b, h, m, n: s + slopes[h] * (n - m), block_mask=bm,
                              enable_gqa=True)

    def ref(q, k, v):
        k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
        pos = torch.arange(q.shape[2])
        s = q @ k.transpose(-1, -2) / 4.0 + slopes.double()[:, None, None] * (pos[None, :] - pos[:, None])
        return torch.softmax(s.masked_fill(pos[None, :] > pos[:, None], -math.inf), -1) @ v

    # dynamic=True compiles once when the first call's block count (3) equals no other size:
    # Dynamo's duck sizing gives equal sizes one symbol, and the heads (H_kv = 2) are fixed
    sizes = ((2, 16), (2, 24), (2, 37)) if mode == "automatic" else ((1, 40), (1, 55))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # flex's eager reference
        with tilewright.config.patch(force_backend="triton"), collect_reports() as reports:
            cf = torch.compile(f, backend="tilewright", dynamic=True if mode == "dynamic=True" else None)
            for B, S in sizes:
                q = torch.randn(B, 4, S, 16, requires_grad=True)
                k, v = (torch.randn(B, 2, S, 16, requires_grad=True) for _ in range(2))
                bm = create_block_mask(lambda b, h, m, n: m >= n, 1, 1, S, S, device="cpu", BLOCK_SIZE=16)
                out = cf(q, k, v, bm)
                go = torch.randn_like(out)
                grads = torch.autograd.grad(out, (q, k, v), go)
                d64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
                want_out = ref(*d64)
                assert rel_err(out, want_out) < TOL[torch.float32]
                for g, w in zip(grads, torch.autograd.grad(want_out, d64, go.double())):
                    assert rel_err(g, w) < TOL[torch.float32]
    dyn = [k for k in _attention_kernels(reports) if "dynamic" in k.problem]
    assert sorted(k.problem.split()[1] for k in dyn) == ["backward", "forward"], [k.problem for k in dyn]
    assert all(k.winner.startswith("triton.attention") for k in dyn), [k.winner for k in dyn]
    assert all(r.fallback is None and not r.kernel_fallbacks for r in reports)
    if mode == "dynamic=True":
        assert len(reports) == 2, [r.kind for r in reports]  # one forward and one backward graph


def test_hand_written_attention_under_dynamic_true():
    """q @ kᵀ / sqrt(q.shape[-1]) + mask, softmax, @ v compiled with dynamic=True (the scale
    is then a tensor computed from the symbolic head dim): rewritten to one generated
    attention kernel with symbolic lengths."""
    torch.manual_seed(3)

    def f(q, k, v, m):
        s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + m
        return torch.softmax(s, dim=-1) @ v

    with tilewright.config.patch(force_backend="triton"), collect_reports() as reports:
        cf = torch.compile(f, backend="tilewright", dynamic=True)
        for S in (8, 11, 20):
            q, k, v = (torch.randn(3, 2, S, 16) for _ in range(3))
            m = torch.randn(3, 1, S, S)
            assert rel_err(cf(q, k, v, m), _sdpa64(q, k, v, m)) < TOL[torch.float32]
    kernels = _attention_kernels(reports)
    assert len(kernels) == 1 and "dynamic" in kernels[0].problem, [k.problem for k in kernels]
    assert _aten_ops(reports) == 0


@pytest.mark.parametrize("fill", ["finfo_min", "-inf"])
def test_fully_masked_rows_give_eagers_values(fill):
    """An additive mask with fully masked rows: finfo.min rows average V (eager's softmax of
    equal scores; the generated kernel returned 0: s * log2(e) overflowed to -inf), -inf rows
    give what eager's CPU kernel gives (0). Rows with one masked key stay right."""
    torch.manual_seed(4)
    value = torch.finfo(torch.float32).min if fill == "finfo_min" else -math.inf
    q, k, v = torch.randn(2, 2, 6, 16), torch.randn(2, 2, 9, 16), torch.randn(2, 2, 9, 16)
    m = torch.randn(2, 1, 6, 9)
    m[0, :, 1] = value
    m[1, :, 4] = value
    m[1, :, 2, 3] = value

    def f(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

    want = f(q, k, v, m)
    with tilewright.config.patch(force_backend="triton"), collect_reports() as reports:
        out = torch.compile(f, backend="tilewright")(q, k, v, m)
    assert _attention_kernels(reports)[0].winner.startswith("triton.attention")
    if fill == "finfo_min":
        torch.testing.assert_close(out[0, :, 1], v[0].mean(1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("force", ["triton", "cpp"])
def test_a_new_buckets_gather_indices_fit_its_tables(force):
    """A gather and an index_put called with 64, 100, then 37 rows: the dynamic graph's bucket
    64 drew indices below the trace-time rows (100) for a 64-row table ('index 6080 out of
    bounds for size 4096': every candidate failed, the graph went to ATen for good). Index
    bounds are now expressions of the graph's sizes."""
    def f(x, idx):
        y = x[idx] * 2
        return torch.zeros_like(x).index_put((idx,), y + 1, accumulate=True)

    torch.manual_seed(6)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with tilewright.config.patch(force_backend=force):
            cf = torch.compile(f, backend="tilewright")
            for n in (64, 100, 37):
                x, idx = torch.randn(n, 64), torch.randint(0, n, (n,))
                torch.testing.assert_close(cf(x, idx), f(x, idx))


@pytest.mark.parametrize("force", ["triton", "cpp"])
def test_a_bucket_that_breaks_the_graphs_size_relation_is_tuned_at_the_calls_sizes(force):
    """A mask of n + 1 columns read at positions 0..n (a decode step's padding mask): the
    graph's two sizes always differ by one, but their buckets (16, 16 for n = 15) do not, so no
    tuning input is valid there (every candidate raised IndexError). The bucket is tuned at the
    call's sizes."""
    def f(pos, mask):
        idx = torch.arange(pos.shape[0] + 1)
        return mask[:, idx].float() * pos.sum()

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with tilewright.config.patch(force_backend=force), collect_reports() as reports:
            cf = torch.compile(f, backend="tilewright")
            for n in (5, 8, 15, 30):
                pos, mask = torch.randn(n), torch.rand(2, n + 1) < 0.5
                torch.testing.assert_close(cf(pos, mask), f(pos, mask))
    assert all(r.fallback is None for r in reports)
    # the static first graph, then one dynamic graph for every size (lowering asks eager whether
    # it has a kernel for an op on tiny operands: a size operand passed as the symbol itself
    # became a guard, specialising the graph to its size: a compile per call)
    assert len(reports) == 2, [r.graph_id for r in reports]


@pytest.mark.parametrize("force", ["triton", "cpp"])
def test_a_first_compile_whose_bucket_breaks_the_size_relation_tunes_at_the_trace_sizes(force):
    """The same mask under ``dynamic=True`` from the first call (generate() with dynamic=True):
    n = 5 traces sizes (5, 6), whose bucket (8, 8) has no valid tuning input. The compile-time
    choice passed no sizes, so it could not fall back to the trace-time ones: every candidate
    failed and the kernel ran on ATen with a warning."""
    def f(pos, mask):
        idx = torch.arange(pos.shape[0] + 1)
        return mask[:, idx].float() * pos.sum()

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with tilewright.config.patch(force_backend=force, strict=True), collect_reports() as reports:
            cf = torch.compile(f, backend="tilewright", dynamic=True)
            for n in (5, 11):
                pos, mask = torch.randn(n), torch.rand(2, n + 1) < 0.5
                torch.testing.assert_close(cf(pos, mask), f(pos, mask))
    assert reports and all(r.fallback is None and not r.kernel_fallbacks for r in reports)


@pytest.mark.parametrize("force", ["triton", "cpp"])
def test_a_size_used_as_a_number_stays_in_the_loop_kernel(force):
    """``arange(n) + past.shape[0]`` in a dynamic graph (a decode step's positions): the SymInt
    operand is read by the loop kernel as a size (it was an ATen add), right at every size."""
    def f(x, past):
        pos = torch.arange(x.shape[0]) + past.shape[0]
        return x * pos.float()[:, None]

    with tilewright.config.patch(force_backend=force), collect_reports() as reports:
        cf = torch.compile(f, backend="tilewright")
        for n, p in ((3, 4), (5, 7), (9, 12), (17, 3)):
            x, past = torch.randn(n, 8), torch.randn(p)
            torch.testing.assert_close(cf(x, past), f(x, past))
    assert len(reports) == 2 and _aten_ops(reports) == 0, [(r.kernel_counts, r.extern_ops) for r in reports]
